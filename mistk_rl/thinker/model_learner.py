"""How the Thinker model learns from real steps (v1.1's model training, single process).

Replay: a ring of real transitions per env (`ModelReplay`), entry t of env e holding s_t, the
action before it, a_t, r_t, the episode's end, truncation and V_tree(s_t). A sample is a window
of 2k + 1 entries (k = model_unroll_len, also the n of the n-step value target), drawn with
prioritized replay (`mistk_rl.rl.data.priority.PrioritySampler`, the DQN agent's too: alpha
priority_alpha; beta annealed from priority_beta to 1 over total_steps; priority
|v(s_t) - target_t|, plus model_reward_priority x the window's reward error when that is > 0:
v1.1 has only the value error, under which a reward seen in a few percent of windows can stay
unlearnt, the reward head at the mean).

Losses of one window, each summed over the unroll, masked once the episode has ended, and
scaled by the importance weight:
- SR-net: reward MSE x model_rs_loss_cost; done BCE x model_done_loss_cost (not on truncated
  steps); frame MSE x model_img_loss_cost between the predicted and the true next frame, both
  in the nets' scale (v1.1's model_img_type 0; its default feature loss, type 1, is not here);
- VP-net, at s_t (true frame) and the k predicted frames after it (detached, as acting sees
  them; true frames for wrapper_type 2): value MSE x model_vs_loss_cost against
  `value_targets`, policy cross-entropy x model_logits_loss_cost against the recorded
  action_prob if require_prob, else the taken action.
Two Adam optimisers (SR, VP) at model_lr, decayed linearly to 0 over total_steps real
transitions.

Training runs inside the MDP's real step (`train_if_due`) once warm-up is over, as v1.1's
single-process mode does: while the replay ratio, transitions trained (updates x batch x k)
per transition recorded after warm-up, is below model_max_replay_ratio, one more update. The
ratio then sits in [max, max + one update's share (batch k / (processed_n - warm-up + 1))].
model_min_replay_ratio is v1.1's bound for its multi-process mode, where actors wait while
the learner is below it; in one process the learner never falls behind, so it is not used.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from mistk_rl.files import atomic_write_bytes
from mistk_rl.rl.data.priority import PrioritySampler
from mistk_rl.thinker.config import ThinkerConfig


class TrainableModel(Protocol):
    """What the learner trains: `model.ThinkerModel` builds the nets and acts with them,
    this module trains them (the learner does not import the model: one arrow, no cycle)."""

    cfg: ThinkerConfig
    num_actions: int
    obs_shape: tuple[int, ...]
    # the nets, typed in `model` (naming their classes here, even for the type checker only,
    # would point an arrow back at the model)
    scale: Any  # observations -> net scale (`model.ObsScale`)
    sr: Any  # the state-reward net, wrapper_type 0 (`model.SRNet`, or None)
    vp: Any  # the value-policy net, unless vp_fn (`model.VPNet`, or None)


CHECKPOINT = "ckp_model.tar"


# ---- value targets ------------------------------------------------------------------------
def value_targets(
    rewards: np.ndarray,
    dones: np.ndarray,
    truncated: np.ndarray,
    baselines: np.ndarray,
    gamma: float,
    n: int,
    k: int,
) -> np.ndarray:
    """n-step targets for s_0 .. s_k of windows [B, k + n + 1] of entries:

        target_i = sum_{j<n} gamma^j r_{i+j} + gamma^n V_tree(s_{i+n})

    (v1.1 bootstraps one step early, from V_tree(s_{i+n-1}): D9 of the notes). An episode that
    terminates at i+j stops the sum after r_{i+j}, with no bootstrap. One truncated at i+j
    (a time limit: the next entry is a new episode's) bootstraps from V_tree(s_{i+j}) instead of
    r_{i+j}: the tree's estimate of the return from its last state, that state's own reward
    included. Targets of states past an episode's end are meaningless: `alive` masks them."""
    b = rewards.shape[0]
    out = np.zeros((b, k + 1), dtype=np.float64)
    for i in range(k + 1):
        g = np.zeros(b)
        disc = 1.0
        alive = np.ones(b, dtype=bool)
        for j in range(n):
            cut = alive & truncated[:, i + j]
            g += np.where(cut, disc * baselines[:, i + j], alive * disc * rewards[:, i + j])
            alive &= ~dones[:, i + j]
            disc *= gamma
        out[:, i] = g + alive * disc * baselines[:, i + n]
    return out.astype(np.float32)


def alive_mask(dones: np.ndarray, k: int) -> np.ndarray:
    """[B, k + 1]: s_i is in the episode of s_0 (no episode end at entries 0 .. i-1)."""
    ended = np.cumsum(dones[:, :k], axis=1) > 0
    return np.concatenate([np.ones((len(dones), 1), dtype=bool), ~ended], axis=1)


# ---- replay -------------------------------------------------------------------------------
class Window(NamedTuple):
    """A sampled batch: `leaves` for the priority update, entries [B, 2k + 1] (frames only
    for s_0 .. s_k), importance weights [B]."""

    leaves: np.ndarray
    frames: np.ndarray
    prev_actions: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    truncated: np.ndarray
    baselines: np.ndarray
    probs: Optional[np.ndarray]
    weights: np.ndarray


class ModelReplay:
    """`env_n` rings of `length` real transitions, and priorities over window starts.

    A start t becomes drawable (`priorities`, over env * length + slot) once entry
    t + window - 1 is recorded and stops being so when its slot is overwritten, so every drawn
    window lies inside the ring."""

    FIELDS = (
        "frames",
        "prev_actions",
        "actions",
        "rewards",
        "dones",
        "truncated",
        "baselines",
        "probs",
    )

    def __init__(
        self,
        env_n: int,
        length: int,
        window: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        num_actions: int,
        with_probs: bool,
        alpha: float,
    ) -> None:
        if length < window:
            raise ValueError(
                f"model_buffer_n / env_n = {length} real steps per env cannot "
                f"hold a sample of {window} (2 model_unroll_len + 1)"
            )
        self.env_n, self.length, self.window = env_n, length, window
        shape = (env_n, length)
        self.frames = np.zeros(shape + obs_shape, dtype=obs_dtype)
        self.prev_actions = np.zeros(shape, dtype=np.int64)
        self.actions = np.zeros(shape, dtype=np.int64)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.dones = np.zeros(shape, dtype=bool)
        self.truncated = np.zeros(shape, dtype=bool)
        self.baselines = np.zeros(shape, dtype=np.float32)
        self.probs = np.zeros(shape + (num_actions,), dtype=np.float32) if with_probs else None
        self.t = 0  # entries recorded per env
        self.priorities = PrioritySampler(env_n * length, alpha)
        self._rows = np.arange(env_n) * length

    def add(self, **entry: Optional[np.ndarray]) -> None:
        slot = self.t % self.length
        for name in self.FIELDS:
            store = getattr(self, name)
            if store is not None:
                store[:, slot] = entry[name]
        self.priorities.remove(self._rows + slot)  # this slot's old window is gone
        self.t += 1
        start = self.t - self.window
        if start >= 0:  # the window from `start` is complete now
            self.priorities.add(self._rows + start % self.length)

    @property
    def ready(self) -> bool:
        return self.priorities.total > 0

    def sample(self, batch: int, beta: float, rng: np.random.Generator, k: int) -> Window:
        leaves = self.priorities.sample(batch, rng)
        env, start = np.divmod(leaves, self.length)
        slots = (start[:, None] + np.arange(self.window)) % self.length
        rows = env[:, None]
        weights = self.priorities.weights(leaves, beta)
        return Window(
            leaves,
            self.frames[rows, slots[:, : k + 1]],
            self.prev_actions[rows, slots],
            self.actions[rows, slots],
            self.rewards[rows, slots],
            self.dones[rows, slots],
            self.truncated[rows, slots],
            self.baselines[rows, slots],
            None if self.probs is None else self.probs[rows, slots],
            weights.astype(np.float32),
        )

    def update_priorities(self, leaves: np.ndarray, errors: np.ndarray) -> None:
        """New priorities of the sampled starts from their errors (`ModelLearner.update`)."""
        self.priorities.update(leaves, np.abs(errors))

    def mark_boundary(self) -> None:
        """End every env's trajectory at the last entry (a resumed run starts new episodes):
        truncated, so targets bootstrap from its V_tree."""
        if self.t:
            slot = (self.t - 1) % self.length
            self.dones[:, slot] = True
            self.truncated[:, slot] = True

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            name: torch.from_numpy(getattr(self, name).copy())
            for name in self.FIELDS
            if getattr(self, name) is not None
        }
        sampler = {
            key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            for key, value in self.priorities.state_dict().items()
        }
        state.update(t=self.t, window=self.window, sampler=sampler)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any], alpha: float) -> ModelReplay:
        frames = state["frames"].numpy()
        num_actions = state["probs"].shape[-1] if "probs" in state else 1
        replay = cls(
            frames.shape[0],
            frames.shape[1],
            int(state["window"]),
            frames.shape[2:],
            frames.dtype,
            num_actions,
            "probs" in state,
            alpha,
        )
        for name in cls.FIELDS:
            if name in state:
                setattr(replay, name, state[name].numpy().copy())
        replay.t = int(state["t"])
        sampler = state.get("sampler")
        if sampler is None:  # written before PrioritySampler: the leaves and the max, p^alpha
            leaves = state["priorities"].numpy()
            sampler = {
                "sum_leaves": leaves,
                "priority": leaves ** (1 / alpha) if alpha else (leaves > 0) * 1.0,
                "max_priority": float(state["max_priority"]) ** (1 / alpha) if alpha else 1.0,
            }
        replay.priorities.load_state_dict(
            {
                key: value.numpy() if torch.is_tensor(value) else value
                for key, value in sampler.items()
            }
        )
        return replay


# ---- the learner --------------------------------------------------------------------------
class ModelLearner:
    """Replay, optimisers, counters and checkpoints of a ThinkerModel's nets."""

    def __init__(self, model: TrainableModel) -> None:
        self.model = model
        cfg = self.cfg = model.cfg
        self.k = cfg.model_unroll_len
        # what there is to train: the SR-net (wrapper_type 0) and the VP-net unless vp_fn
        self.trainable = cfg.train_model and (model.sr is not None or model.vp is not None)
        self.optimizers = {
            name: torch.optim.Adam(net.parameters(), lr=cfg.model_lr)
            for name, net in (("sr", model.sr), ("vp", model.vp))
            if net is not None
        }
        self.replay: Optional[ModelReplay] = None
        self.rng = np.random.default_rng(cfg.seed)
        self.processed_n = 0  # real transitions recorded (env_n per real step)
        self.updates = 0
        self.update_s = 0.0  # wall time in `update` (not checkpointed: this process's)
        self.losses: dict[str, float] = {}
        self._prev_actions: Optional[np.ndarray] = None  # the action into each env's s_t
        self._last_ckp = time.monotonic()
        self.path = (Path(cfg.savedir) / cfg.xpid / CHECKPOINT) if cfg.xpid else None
        if cfg.ckp:
            if self.path is None or not self.path.is_file():
                raise FileNotFoundError(
                    f"ckp is set but there is no model checkpoint at "
                    f"{self.path or 'savedir/xpid (xpid is not set)'}"
                )
            self.load(self.path)

    # ---- recording and the replay ratio ---------------------------------------------------
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
        if not self.trainable:
            return
        cfg, n = self.cfg, len(actions)
        if self.cfg.require_prob and action_probs is None:
            raise ValueError("require_prob is set: record needs action_probs [env_n, A]")
        if self.replay is None:
            self.replay = ModelReplay(
                n,
                cfg.model_buffer_n // n,
                2 * self.k + 1,
                self.model.obs_shape,
                np.asarray(frames).dtype,
                self.model.num_actions,
                cfg.require_prob,
                cfg.priority_alpha,
            )
        if self.replay.env_n != n:
            raise ValueError(f"record got {n} envs, the replay holds {self.replay.env_n}")
        if self._prev_actions is None:
            self._prev_actions = np.zeros(n, dtype=np.int64)
        dones = np.asarray(dones, dtype=bool)
        self.replay.add(
            frames=frames,
            prev_actions=self._prev_actions,
            actions=actions,
            rewards=rewards,
            dones=dones,
            truncated=truncated,
            baselines=baselines,
            probs=None if not cfg.require_prob else action_probs,
        )
        # the root after an episode's end is reached by action 0, as the MDP's root is
        self._prev_actions = np.where(dones, 0, np.asarray(actions, dtype=np.int64))
        self.processed_n += n

    @property
    def replay_ratio(self) -> float:
        trained = self.updates * self.cfg.model_batch_size * self.k
        return trained / max(1, self.processed_n - self.cfg.model_warm_up_n + 1)

    def train_if_due(self) -> None:
        """Update while the replay ratio is below its maximum (after warm-up; module doc);
        checkpoint every ckp_every_s seconds."""
        if not self.trainable or self.processed_n < self.cfg.model_warm_up_n:
            return
        if self.replay is not None and self.replay.ready:
            start = time.perf_counter()
            while self.replay_ratio < self.cfg.model_max_replay_ratio:
                self.update()
            self.update_s += time.perf_counter() - start
        if self.path is not None and time.monotonic() - self._last_ckp >= self.cfg.ckp_every_s:
            self.save(self.path)

    def status(self) -> dict[str, Any]:
        if not self.trainable:
            return {"processed_n": 0, "warm_up_n": 0, "running": False, "finish": True}
        return {
            "processed_n": self.processed_n,
            "warm_up_n": self.cfg.model_warm_up_n,
            "running": self.processed_n >= self.cfg.model_warm_up_n,
            "finish": self.processed_n >= self.cfg.total_steps,
        }

    # ---- one update -----------------------------------------------------------------------
    def update(self) -> None:
        cfg, model, k = self.cfg, self.model, self.k
        progress = min(1.0, self.processed_n / cfg.total_steps)
        beta = cfg.priority_beta + (1.0 - cfg.priority_beta) * progress
        replay = self.replay
        assert replay is not None  # (`train_if_due` updates once the replay is ready)
        w = replay.sample(cfg.model_batch_size, beta, self.rng, k)
        targets = torch.from_numpy(
            value_targets(w.rewards, w.dones, w.truncated, w.baselines, cfg.discounting, k, k)
        )
        alive = torch.from_numpy(alive_mask(w.dones, k)).float()
        weights = torch.from_numpy(w.weights)
        x = model.scale(w.frames)  # [B, k + 1, *obs]
        prev = torch.from_numpy(w.prev_actions[:, : k + 1])
        losses: dict[str, torch.Tensor] = {}
        vp_frames = x
        if model.sr is not None:
            losses, predicted = self.sr_losses(w, x, alive)
            vp_frames = torch.stack([x[:, 0]] + [p.detach() for p in predicted], dim=1)
        if model.vp is not None:
            vp_losses, v0 = self._vp_losses(w, vp_frames, prev, targets, alive)
            losses.update(vp_losses)
        else:  # vp_fn: priorities from its values of the true s_t
            assert cfg.vp_fn is not None  # (the model builds a VP-net unless vp_fn is set)
            v0 = torch.as_tensor(
                np.asarray(cfg.vp_fn(w.frames[:, 0])[0], dtype=np.float32)
            ).reshape(-1)
        costs = {
            "rs": cfg.model_rs_loss_cost,
            "done": cfg.model_done_loss_cost,
            "img": cfg.model_img_loss_cost,
            "vs": cfg.model_vs_loss_cost,
            "logits": cfg.model_logits_loss_cost,
        }
        total = sum(
            costs[name] * (weights * per_sample).mean() for name, per_sample in losses.items()
        )
        assert isinstance(total, torch.Tensor)  # (a net to train gives losses: never sum() 0)
        lr = cfg.model_lr * max(0.0, 1.0 - progress)
        for opt in self.optimizers.values():
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
        total.backward()
        for name, opt in self.optimizers.items():
            if cfg.model_grad_norm_clip > 0:
                torch.nn.utils.clip_grad_norm_(
                    getattr(model, name).parameters(), cfg.model_grad_norm_clip
                )
            opt.step()
        errors = (v0 - targets[:, 0]).detach().abs()
        if cfg.model_reward_priority > 0 and "rs" in losses:
            errors = errors + cfg.model_reward_priority * losses["rs"].detach().sqrt()
        replay.update_priorities(w.leaves, errors.numpy())
        self.updates += 1
        self.losses = {
            name: float(per_sample.detach().mean()) for name, per_sample in losses.items()
        }
        self.losses["total"] = float(total.detach())

    def sr_losses(
        self, w: Window, x: torch.Tensor, alive: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """Per-sample SR losses summed over the unroll, and the predicted frames."""
        sr, k = self.model.sr, self.k
        if sr is None:
            raise RuntimeError("sr_losses needs the state-reward net (wrapper_type 0)")
        actions = torch.from_numpy(w.actions)
        rewards = torch.from_numpy(w.rewards)
        truncated = torch.from_numpy(w.truncated).float()
        terminal = torch.from_numpy(w.dones & ~w.truncated).float()
        h = sr.encode(x[:, 0], torch.from_numpy(w.prev_actions[:, 0]))
        rs = img = done = torch.zeros(len(h))
        predicted = []
        for j in range(k):
            h, r, done_logit, frame = sr.step(h, actions[:, j])
            rs = rs + alive[:, j] * (r - rewards[:, j]) ** 2
            # the frame after a terminal step is the next episode's: alive[j + 1] excludes it
            img = img + alive[:, j + 1] * (frame - x[:, j + 1]).pow(2).flatten(1).mean(1)
            if done_logit is not None:
                bce = F.binary_cross_entropy_with_logits(
                    done_logit, terminal[:, j], reduction="none"
                )
                done = done + alive[:, j] * (1.0 - truncated[:, j]) * bce
            predicted.append(frame)
        losses = {"rs": rs, "img": img}
        if sr.done is not None:
            losses["done"] = done
        return losses, predicted

    def _vp_losses(
        self,
        w: Window,
        frames: torch.Tensor,
        prev: torch.Tensor,
        targets: torch.Tensor,
        alive: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Per-sample VP losses over s_0 .. s_k, and v(s_0) for the priorities."""
        b, k1 = frames.shape[:2]
        vp = self.model.vp
        assert vp is not None  # (`update` asks for these losses only with a VP-net)
        v, logits = vp(frames.flatten(0, 1), prev.flatten())
        v, logits = v.reshape(b, k1), logits.reshape(b, k1, -1)
        log_p = F.log_softmax(logits, dim=-1)
        if w.probs is not None:
            ce = -(torch.from_numpy(w.probs[:, :k1]) * log_p).sum(-1)
        else:
            taken = torch.from_numpy(w.actions[:, :k1])
            ce = -log_p.gather(-1, taken[..., None])[..., 0]
        losses = {"vs": (alive * (v - targets) ** 2).sum(1), "logits": (alive * ce).sum(1)}
        return losses, v[:, 0].detach()

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Nets, optimisers, counters, the sampling RNG and the whole replay (a resumed run
        trains on what it had, at the same replay ratio; 200k puzzle entries are ~40 MB)."""
        model = self.model
        return {
            "sr": None if model.sr is None else model.sr.state_dict(),
            "vp": None if model.vp is None else model.vp.state_dict(),
            "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
            "processed_n": self.processed_n,
            "updates": self.updates,
            "losses": dict(self.losses),
            "rng": self.rng.bit_generator.state,
            "replay": None if self.replay is None else self.replay.state_dict(),
        }

    def save(self, path: Path) -> None:
        buffer = io.BytesIO()
        torch.save(self.state_dict(), buffer)
        atomic_write_bytes(path, buffer.getvalue())
        self._last_ckp = time.monotonic()

    def load(self, path: Path) -> None:
        """Restore a checkpoint. The envs restart their episodes, so the replay's last entry
        is marked as a truncation (no window runs from an old episode into a new one)."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = self.model
        for name in ("sr", "vp"):
            net = getattr(model, name)
            if (net is None) != (state[name] is None):
                raise ValueError(
                    f"{path}: the checkpoint's {name} net does not match this "
                    "model (wrapper_type or vp_fn differ)"
                )
            if net is not None:
                net.load_state_dict(state[name])
                self.optimizers[name].load_state_dict(state["optimizers"][name])
        self.processed_n, self.updates = int(state["processed_n"]), int(state["updates"])
        self.losses = dict(state["losses"])
        self.rng.bit_generator.state = state["rng"]
        self.replay = (
            None
            if state["replay"] is None
            else ModelReplay.from_state(state["replay"], self.cfg.priority_alpha)
        )
        if self.replay is not None:
            self.replay.mark_boundary()
        self._prev_actions = None

    def close(self) -> None:
        if self.path is not None and self.trainable and self.processed_n:
            self.save(self.path)
