"""Torch models for discrete-action agents, and the glue from gymnasium spaces to tensors.

Models follow DI-engine's convention: `forward` returns a dict, and its "logit" entry holds Q
values or policy logits. The wrappers in `mistk_rl.rl.wrappers` turn that into actions, so one
model serves learning, collection and evaluation.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

Activation = str | type[nn.Module]
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU,
}


def activation_class(activation: Activation) -> type[nn.Module]:
    """An activation class from its config name ("relu", "tanh", ...) or the class itself."""
    if isinstance(activation, str):
        try:
            return ACTIVATIONS[activation.lower()]
        except KeyError:
            raise ValueError(f"unknown activation {activation!r}; valid: "
                             f"{', '.join(ACTIVATIONS)}") from None
    return activation


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights and constant bias: the initialisation CleanRL's PPO relies on."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


# ---- spaces -> tensors ----------------------------------------------------------------------

def obs_dim_of(space: spaces.Space) -> int:
    """Width of `encode_obs(space, ...)`: prod(shape) for Box/MultiBinary, n for Discrete."""
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return int(np.prod(space.shape))
    raise TypeError(f"no flat encoding for observation space {space}")


def action_n_of(space: spaces.Space) -> int:
    """Number of actions; the heads here emit one logit per action of a Discrete space."""
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    raise TypeError(f"discrete-action models need a Discrete action space, got {space}")


def encode_obs(space: spaces.Space, obs: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A batch of observations [B, *shape] as float features [B, obs_dim_of(space)].

    Discrete observations are one-hot encoded (an index is a category, not a magnitude);
    the others are flattened and cast to float32.
    """
    obs = torch.as_tensor(obs)
    if isinstance(space, spaces.Discrete):
        index = obs.long().reshape(-1) - int(space.start)
        return F.one_hot(index, int(space.n)).float()
    obs_dim_of(space)  # raises for spaces without a flat encoding
    return obs.reshape(obs.shape[0], -1).float()


# ---- building blocks ------------------------------------------------------------------------

class MLP(nn.Module):
    """Linear layers with an activation after each hidden one; `out_dim` adds a final linear
    layer without activation (logits, values). `output_dim` is the width of the output."""

    def __init__(self, in_dim: int, hidden_sizes: Sequence[int],
                 activation: Activation = nn.ReLU, out_dim: int | None = None) -> None:
        super().__init__()
        act = activation_class(activation)
        layers: list[nn.Module] = []
        width = in_dim
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), act()]
            width = size
        if out_dim is not None:
            layers.append(nn.Linear(width, out_dim))
            width = out_dim
        self.net = nn.Sequential(*layers)
        self.output_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MLPEncoder(nn.Module):
    """Flattens observations [B, *obs_shape] and encodes them to `output_dim` features."""

    def __init__(self, obs_dim: int, hidden_sizes: Sequence[int] = (64, 64),
                 activation: Activation = "relu") -> None:
        super().__init__()
        self.mlp = MLP(obs_dim, hidden_sizes, activation)
        self.output_dim = self.mlp.output_dim
        # kept so forward need not walk the module tree (it runs once per env step)
        self._first_layer = next((m for m in self.mlp.modules() if isinstance(m, nn.Linear)),
                                 None)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # cast to the model's dtype: numpy observations arrive as float64
        dtype = torch.float32 if self._first_layer is None else self._first_layer.weight.dtype
        return self.mlp(obs.flatten(start_dim=1).to(dtype))


class QHead(nn.Module):
    """Q values [B, action_n] from features.

    Plain: one linear layer (after an optional hidden one) gives Q. Dueling (Wang et al. 2016)
    adds a state-value stream V, reads `out` as advantages A and returns
    Q = V + A - mean(A): subtracting the mean makes V and A identifiable.
    """

    def __init__(self, in_dim: int, action_n: int, dueling: bool = False,
                 hidden_size: int | None = None, activation: Activation = "relu") -> None:
        super().__init__()
        hidden = [hidden_size] if hidden_size else []
        self.dueling = dueling
        self.out = MLP(in_dim, hidden, activation, out_dim=action_n)
        self.value = MLP(in_dim, hidden, activation, out_dim=1) if dueling else None

    def streams(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(V [B, 1], A [B, action_n]) of the dueling head."""
        if not self.dueling:
            raise RuntimeError("streams() needs a dueling head")
        return self.value(features), self.out(features)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.out(features)
        value, advantage = self.streams(features)
        return value + advantage - advantage.mean(dim=-1, keepdim=True)


class QNetwork(nn.Module):
    """Encoder + Q head: `forward(obs) -> {"logit": Q [B, action_n]}`. The encoder (any module
    with an `output_dim`; `mistk_rl.rl.encoders.make_encoder` picks one by observation space)
    takes the raw observations."""

    def __init__(self, encoder: nn.Module, action_n: int, dueling: bool = False,
                 activation: Activation = "relu") -> None:
        super().__init__()
        self.encoder = encoder
        self.head = QHead(self.encoder.output_dim, action_n, dueling, activation=activation)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logit": self.head(self.encoder(obs))}


class ActorCriticHead(nn.Module):
    """Policy and state value from features; small policy init (gain 0.01) starts near-uniform
    (discrete) or near-zero mean (continuous).

    Discrete: `actor` gives {"logit": [B, action_n]}. Continuous (`continuous=True`,
    `action_n` = action dims): a diagonal Gaussian, {"mu": [B, action_n], "log_std":
    [B, action_n]}, the log-std a state-independent parameter starting at `log_std_init`
    (SB3's and CleanRL's PPO: exploration noise learnt, not predicted).
    """

    def __init__(self, in_dim: int, action_n: int, continuous: bool = False,
                 log_std_init: float = 0.0) -> None:
        super().__init__()
        self.continuous = continuous
        self.policy = layer_init(nn.Linear(in_dim, action_n), gain=0.01)
        self.value = layer_init(nn.Linear(in_dim, 1), gain=1.0)
        self.log_std = (nn.Parameter(torch.full((action_n,), float(log_std_init)))
                        if continuous else None)

    def actor(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.policy(features)
        if not self.continuous:
            return {"logit": out}
        # a sum, not expand_as: a view of the parameter would require grad under no_grad too
        return {"mu": out, "log_std": self.log_std + torch.zeros_like(out)}

    def forward(self, actor_features: torch.Tensor,
                critic_features: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Policy outputs from `actor_features`, value [B] from `critic_features` (default:
        the same)."""
        if critic_features is None:
            critic_features = actor_features
        return {**self.actor(actor_features), "value": self.value(critic_features).squeeze(-1)}


class ActorCritic(nn.Module):
    """PPO/A2C model: `forward(obs) -> {"logit": [B, action_n], "value": [B]}`, or with
    `continuous=True` {"mu", "log_std": [B, action_n], "value"} (see `ActorCriticHead`).

    `obs_dim`: the observation space (the encoder `mistk_rl.rl.encoders.make_encoder` picks for
    it takes raw observations) or, for flat features already encoded, their width (an MLP).
    Actor and critic get separate encoders by default (CleanRL's PPO: the value loss does not
    disturb the policy features); `share_encoder=True` uses one. Hidden layers (linear and
    convolutional) are orthogonally initialised with gain sqrt(2).
    """

    def __init__(self, obs_dim: int | spaces.Space, action_n: int,
                 hidden_sizes: Sequence[int] = (64, 64), activation: Activation = "tanh",
                 share_encoder: bool = False, continuous: bool = False,
                 log_std_init: float = 0.0) -> None:
        super().__init__()
        self.actor_encoder = self._encoder(obs_dim, hidden_sizes, activation)
        self.critic_encoder = (None if share_encoder
                               else self._encoder(obs_dim, hidden_sizes, activation))
        self.head = ActorCriticHead(self.actor_encoder.output_dim, action_n, continuous,
                                    log_std_init)

    @staticmethod
    def _encoder(obs_dim: int | spaces.Space, hidden_sizes: Sequence[int],
                 activation: Activation) -> nn.Module:
        if isinstance(obs_dim, spaces.Space):
            from mistk_rl.rl.encoders import make_encoder  # (encoders builds on this module)
            encoder = make_encoder(obs_dim, hidden_sizes, activation)
        else:
            encoder = MLPEncoder(obs_dim, hidden_sizes, activation)
        for module in encoder.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                layer_init(module)
        return encoder

    @property
    def share_encoder(self) -> bool:
        return self.critic_encoder is None

    def _critic_features(self, obs: torch.Tensor) -> torch.Tensor:
        encoder = self.actor_encoder if self.critic_encoder is None else self.critic_encoder
        return encoder(obs)

    def compute_actor(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.head.actor(self.actor_encoder(obs))

    def compute_critic(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"value": self.head.value(self._critic_features(obs)).squeeze(-1)}

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        actor_features = self.actor_encoder(obs)
        if self.share_encoder:
            return self.head(actor_features)  # encode once
        return self.head(actor_features, self.critic_encoder(obs))
