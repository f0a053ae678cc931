"""The Thinker MDP's learned model (wrapper_type 0) and value-policy net: networks and acting.

Two networks, as v1.1's "dual net" without the value-policy net's RNN:

- `SRNet` (state-reward): encodes a real frame and the previous action into a hidden state h,
  steps h with an action (the dynamics), and reads the reward, the episode's end and the next
  frame off the new h. It learns from rewards, dones and frames only.
- `VPNet` (value-policy): the value and policy logits of a frame and the previous action: the
  real frame at a root, the SR-net's predicted frame below it. It has its own encoder, so
  value errors never bend the model of the world (v1.1's reason for two nets), and
  `cfg.vp_fn` can stand in for it on the same frames. wrapper_type 2 (the perfect model)
  builds only this net and runs it on true frames.

Frames are (C, H, W) planes, kept at full resolution by padded 3x3 convolutions (the puzzle is
7x7), or 1-D vectors, through MLPs with LayerNorm (v1.1 takes images only: an extension).
`ThinkerModel` is what the augmented MDP holds: numpy in, numpy out; its learning (replay,
losses, checkpoints) is `model_learner.ModelLearner`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

from mistk_rl.thinker.config import ThinkerConfig
from mistk_rl.thinker.model_learner import ModelLearner

CHANNELS = 16  # conv channels per unit of model_size_nn: 7x7 planes need few
WIDTH = 128  # MLP width per unit of model_size_nn (1-D observations)
HEAD = 64  # hidden width of the reward, done, value and policy heads
BOUNDED = 1e6  # an observation dim with a wider range (CartPole's speeds) is not rescaled


class ObsScale(nn.Module):
    """Observations to the nets' scale and back: (x - low) / (high - low) on the dims whose
    bounds are finite and narrower than BOUNDED; the other dims pass through."""

    offset: torch.Tensor  # (buffers: registered below)
    scale: torch.Tensor

    def __init__(self, space: spaces.Box) -> None:
        super().__init__()
        low = np.asarray(space.low, dtype=np.float64)
        high = np.asarray(space.high, dtype=np.float64)
        span = high - low
        bounded = np.isfinite(span) & (span > 0) & (span < BOUNDED)
        self.register_buffer(
            "offset", torch.tensor(np.where(bounded, low, 0.0), dtype=torch.float32)
        )
        self.register_buffer(
            "scale", torch.tensor(np.where(bounded, span, 1.0), dtype=torch.float32)
        )
        self.low = np.maximum(low, np.finfo(np.float32).min).astype(np.float32)
        self.high = np.minimum(high, np.finfo(np.float32).max).astype(np.float32)

    def forward(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        return (torch.as_tensor(frames).float() - self.offset) / self.scale

    def to_obs(self, x: torch.Tensor) -> np.ndarray:
        """Net-scale frames back to the observation's scale, clipped to its bounds (float32:
        a predicted uint8 frame is not rounded)."""
        return np.clip((x * self.scale + self.offset).numpy(), self.low, self.high)


def is_image(shape: Sequence[int]) -> bool:
    return len(shape) == 3


def with_action(x: torch.Tensor, actions: torch.Tensor, num_actions: int) -> torch.Tensor:
    """Append the one-hot action: as constant planes to an image, as entries to a vector."""
    one_hot = F.one_hot(actions.long(), num_actions).float()
    if x.dim() == 4:
        one_hot = one_hot[:, :, None, None].expand(-1, -1, x.shape[2], x.shape[3])
        # channels-last convolutions run 3x faster on CPU at these sizes (137 vs 491 us for
        # 16 planes of 7x7, batch 16)
        return torch.cat([x, one_hot], dim=1).contiguous(memory_format=torch.channels_last)
    return torch.cat([x, one_hot], dim=1)


class ResBlock(nn.Module):
    """Pre-activation residual block of two padded 3x3 convolutions."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


def trunk(obs_shape: Sequence[int], extra: int, size: int) -> tuple[nn.Module, tuple[int, ...]]:
    """[frame-like input + `extra` action entries] -> features, and the features' shape."""
    if is_image(obs_shape):
        c, h, w = obs_shape
        ch = CHANNELS * size
        net = nn.Sequential(nn.Conv2d(c + extra, ch, 3, padding=1), ResBlock(ch), nn.ReLU())
        return net, (ch, h, w)
    width = WIDTH * size
    net = nn.Sequential(
        nn.Linear(int(np.prod(obs_shape)) + extra, width),
        nn.LayerNorm(width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.LayerNorm(width),
        nn.ReLU(),
    )
    return net, (width,)


class Head(nn.Module):
    """Features -> `out` numbers (reward, done logit, value and logits); `zero` zeroes the last
    layer so an untrained head answers exactly 0.

    On image features the head reads each cell's features reduced to 4 channels (where things
    are) and every channel's maximum over the cells (whether something happens anywhere): a
    reward such as "the box reached a target" is then one pattern learnt once for every cell,
    not 25 separate weights each taught only by the solves at its own cell (without it the
    reward head never left the mean-reward plateau on the agent's own play: issue 58)."""

    def __init__(self, feature_shape: tuple[int, ...], out: int, zero: bool) -> None:
        super().__init__()
        self.pool: Optional[nn.Module] = None
        if len(feature_shape) == 3:
            ch, h, w = feature_shape
            self.reduce: nn.Module = nn.Sequential(nn.Conv2d(ch, 4, 1), nn.ReLU(), nn.Flatten())
            self.pool = nn.Sequential(nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten())
            flat = 4 * h * w + ch
        else:
            self.reduce, flat = nn.Identity(), feature_shape[0]
        self.hidden = nn.Linear(flat, HEAD)
        self.out = nn.Linear(HEAD, out)
        if zero:
            nn.init.zeros_(self.out.weight)
            nn.init.zeros_(self.out.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.reduce(features)
        if self.pool is not None:
            x = torch.cat([x, self.pool(features)], dim=1)
        return self.out(F.relu(self.hidden(x)))


class SRNet(nn.Module):
    """State-reward net: encoder, dynamics, and reward / done / frame read-outs of h."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int,
        size: int,
        predict_done: bool,
        zero_init: bool,
    ) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.encoder, h_shape = trunk(obs_shape, num_actions, size)
        self.h_shape = h_shape
        if is_image(obs_shape):
            ch = h_shape[0]
            self.dynamics: nn.Module = nn.Sequential(
                nn.Conv2d(ch + num_actions, ch, 3, padding=1), ResBlock(ch), ResBlock(ch), nn.ReLU()
            )
            self.decoder: nn.Module = nn.Sequential(
                ResBlock(ch), nn.ReLU(), nn.Conv2d(ch, obs_shape[0], 3, padding=1)
            )
        else:
            width = h_shape[0]
            self.dynamics = nn.Sequential(
                nn.Linear(width + num_actions, width),
                nn.LayerNorm(width),
                nn.ReLU(),
                nn.Linear(width, width),
                nn.LayerNorm(width),
                nn.ReLU(),
            )
            self.decoder = nn.Sequential(
                nn.Linear(width, width), nn.ReLU(), nn.Linear(width, int(np.prod(obs_shape)))
            )
        self.obs_shape = tuple(obs_shape)
        self.reward = Head(h_shape, 1, zero_init)
        self.done = Head(h_shape, 1, zero_init) if predict_done else None

    def encode(self, x: torch.Tensor, prev_actions: torch.Tensor) -> torch.Tensor:
        """h of net-scale frames [B, *obs] after `prev_actions` [B]."""
        return self.encoder(with_action(x, prev_actions, self.num_actions))

    def step(
        self, h: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """One imagined step: (next h, reward [B], done logit [B] or None, next frame)."""
        h = self.dynamics(with_action(h, actions, self.num_actions))
        done = None if self.done is None else self.done(h)[:, 0]
        frame = self.decoder(h).reshape(len(h), *self.obs_shape)
        return h, self.reward(h)[:, 0], done, frame


class VPNet(nn.Module):
    """Value-policy net: (net-scale frame, previous action) -> (value [B], logits [B, A])."""

    def __init__(
        self, obs_shape: Sequence[int], num_actions: int, size: int, zero_init: bool
    ) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.encoder, shape = trunk(obs_shape, num_actions, size)
        self.head = Head(shape, 1 + num_actions, zero_init)

    def forward(
        self, x: torch.Tensor, prev_actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.head(self.encoder(with_action(x, prev_actions, self.num_actions)))
        return out[:, 0], out[:, 1:]


class ModelOutput(NamedTuple):
    """What the model says of m nodes (the augmented MDP's `expand` reads it)."""

    states: list[Any]  # one node state per row: the SR-net's hidden state (a tensor)
    reward: np.ndarray  # [m] float32 predicted reward (0 for `initial`)
    done: np.ndarray  # [m] bool predicted episode end (all False without a done head)
    v: np.ndarray  # [m] float32 value
    logits: np.ndarray  # [m, A] float32 policy logits
    hs: Optional[np.ndarray]  # [m, *h_shape] the hidden states, for state["hs"]
    xs: Optional[np.ndarray]  # [m, *obs_shape] the (predicted) frames, observation scale


class ThinkerModel:
    """The model the augmented MDP calls: `initial` and `unroll` (wrapper_type 0) and
    `value_policy` (true frames; wrapper_type 2), and its learning from real steps:
    `record`, `train_if_due`, `status`, `save`/`load`, `close` (see `ModelLearner`)."""

    def __init__(
        self, cfg: ThinkerConfig, observation_space: spaces.Space, num_actions: int
    ) -> None:
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) not in (
            1,
            3,
        ):
            raise ValueError(
                "the Thinker model takes Box observations, (C, H, W) frames or "
                f"1-D vectors, not {observation_space}"
            )
        self.cfg = cfg
        self.num_actions = int(num_actions)
        self.obs_shape = tuple(observation_space.shape)
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed)
        self.scale = ObsScale(observation_space)
        size = max(1, int(cfg.model_size_nn))
        self.sr: Optional[SRNet] = None
        if cfg.wrapper_type == 0:
            self.sr = SRNet(
                self.obs_shape,
                self.num_actions,
                size,
                cfg.model_done_loss_cost > 0,
                cfg.model_zero_init,
            )
        self.vp: Optional[VPNet] = None
        if cfg.vp_fn is None:
            self.vp = VPNet(self.obs_shape, self.num_actions, size, cfg.model_zero_init)
        for net in (self.sr, self.vp):
            if net is not None and is_image(self.obs_shape):
                # (torch's stubs lack `to`'s memory_format overload)
                net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.learner = ModelLearner(self)

    # ---- acting: numpy in, numpy out ----------------------------------------------------
    @torch.inference_mode()
    def initial(self, frames: np.ndarray, prev_actions: np.ndarray) -> ModelOutput:
        """Roots from real frames [n, *obs] reached by `prev_actions` [n] (0 after a reset)."""
        sr = self._need_sr()
        x, a = self.scale(frames), torch.as_tensor(np.asarray(prev_actions, dtype=np.int64))
        h = sr.encode(x, a)
        v, logits = self._vp(x, a, frames)
        n = len(h)
        return ModelOutput(
            list(h.unbind(0)),
            np.zeros(n, dtype=np.float32),
            np.zeros(n, dtype=bool),
            v,
            logits,
            h.numpy(),
            np.asarray(frames, dtype=np.float32),
        )

    @torch.inference_mode()
    def unroll(self, states: list[Any], actions: np.ndarray) -> ModelOutput:
        """One imagined step from m node states (from `initial` or `unroll`)."""
        sr = self._need_sr()
        a = torch.as_tensor(np.asarray(actions, dtype=np.int64))
        h, reward, done_logit, x = sr.step(torch.stack(states), a)
        xs = self.scale.to_obs(x)
        v, logits = self._vp(x, a, xs)
        done = np.zeros(len(h), dtype=bool) if done_logit is None else (done_logit > 0).numpy()
        return ModelOutput(
            list(h.unbind(0)), reward.numpy().astype(np.float32), done, v, logits, h.numpy(), xs
        )

    @torch.inference_mode()
    def value_policy(
        self, frames: np.ndarray, prev_actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The value-policy net (or vp_fn) on true frames: the perfect model's evaluator."""
        a = torch.as_tensor(np.asarray(prev_actions, dtype=np.int64))
        return self._vp(self.scale(frames), a, frames)

    def _vp(
        self, x: torch.Tensor, prev_actions: torch.Tensor, frames: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """VPNet on net-scale `x`, or cfg.vp_fn on the same frames in observation scale."""
        if self.vp is not None:
            v_net, logits_net = self.vp(x, prev_actions)
            return v_net.numpy(), logits_net.numpy()
        vp_fn = self.cfg.vp_fn
        assert vp_fn is not None  # (the VP-net is built unless vp_fn stands in for it)
        v, logits = vp_fn(frames)
        return (
            np.asarray(v, dtype=np.float32).reshape(len(frames)),
            np.asarray(logits, dtype=np.float32).reshape(len(frames), self.num_actions),
        )

    @property
    def h_shape(self) -> tuple[int, ...]:
        """The learned model's hidden state shape (state["hs"])."""
        return self._need_sr().h_shape

    def _need_sr(self) -> SRNet:
        if self.sr is None:
            raise RuntimeError(
                "initial/unroll need the learned model (wrapper_type 0); the "
                "perfect model calls value_policy on true frames"
            )
        return self.sr

    # ---- learning (model_learner.ModelLearner) -------------------------------------------
    def record(
        self,
        frames: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        dones: np.ndarray,
        truncated: np.ndarray,
        baselines: np.ndarray,
        action_probs: Optional[np.ndarray] = None,
    ) -> None:
        """One real step of every env: s_t, a_t, r_t, episode end, truncation, V_tree(s_t)."""
        self.learner.record(frames, actions, rewards, dones, truncated, baselines, action_probs)

    def train_if_due(self) -> None:
        self.learner.train_if_due()

    def status(self) -> dict[str, Any]:
        return self.learner.status()

    @property
    def losses(self) -> dict[str, float]:
        return self.learner.losses

    def save(self, path: str | Path) -> None:
        self.learner.save(Path(path))

    def load(self, path: str | Path) -> None:
        self.learner.load(Path(path))

    def close(self) -> None:
        self.learner.close()
