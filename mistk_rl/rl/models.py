"""Torch models for the agents: Q networks (DQN) and actor-critics (PPO), each an encoder
chosen by the observation space (`mistk_rl.rl.encoders`) plus a head.

Models follow DI-engine's convention: `forward` returns a dict, and its "logit" entry holds Q
values or policy logits. The wrappers in `mistk_rl.rl.wrappers` turn that into actions, so one
model serves learning, collection and evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from mistk_rl.rl.data.collate import Batch
from mistk_rl.rl.encoders import MLP, Activation, Encoder, layer_init, make_encoder


class QHead(nn.Module):
    """Q values [B, action_n] from features.

    Plain: one linear layer (after an optional hidden one) gives Q. Dueling (Wang et al. 2016)
    adds a state-value stream V, reads `out` as advantages A and returns
    Q = V + A - mean(A): subtracting the mean makes V and A identifiable.
    """

    def __init__(
        self,
        in_dim: int,
        action_n: int,
        dueling: bool = False,
        hidden_size: int | None = None,
        activation: Activation = "relu",
    ) -> None:
        super().__init__()
        hidden = [hidden_size] if hidden_size else []
        self.dueling = dueling
        self.out = MLP(in_dim, hidden, activation, out_dim=action_n)
        self.value = MLP(in_dim, hidden, activation, out_dim=1) if dueling else None

    def streams(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(V [B, 1], A [B, action_n]) of the dueling head."""
        if self.value is None:
            raise RuntimeError("streams() needs a dueling head")
        return self.value(features), self.out(features)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.out(features)
        value, advantage = self.streams(features)
        return value + advantage - advantage.mean(dim=-1, keepdim=True)


class QNetwork(nn.Module):
    """Encoder + Q head: `forward(obs) -> {"logit": Q [B, action_n]}`, from raw observations
    of `observation_space`."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_n: int,
        hidden_sizes: Sequence[int] = (64, 64),
        dueling: bool = False,
        activation: Activation = "relu",
        encoder: str = "auto",
    ) -> None:
        super().__init__()
        self.encoder = make_encoder(observation_space, hidden_sizes, activation, encoder)
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

    def __init__(
        self, in_dim: int, action_n: int, continuous: bool = False, log_std_init: float = 0.0
    ) -> None:
        super().__init__()
        self.continuous = continuous
        self.policy = layer_init(nn.Linear(in_dim, action_n), gain=0.01)
        self.value = layer_init(nn.Linear(in_dim, 1), gain=1.0)
        self.log_std = (
            nn.Parameter(torch.full((action_n,), float(log_std_init))) if continuous else None
        )

    def actor(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.policy(features)
        if self.log_std is None:  # (discrete)
            return {"logit": out}
        # a sum, not expand_as: a view of the parameter would require grad under no_grad too
        return {"mu": out, "log_std": self.log_std + torch.zeros_like(out)}

    def forward(
        self, actor_features: torch.Tensor, critic_features: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Policy outputs from `actor_features`, value [B] from `critic_features` (default:
        the same)."""
        if critic_features is None:
            critic_features = actor_features
        return {**self.actor(actor_features), "value": self.value(critic_features).squeeze(-1)}


class ActorCriticModel(nn.Module):
    """What PPO learns with (`policies.ppo.PPOPolicy._build_model`): `forward(obs)` gives the
    policy's outputs and "value", `compute_critic(obs)` the value alone (a bootstrap's)."""

    def compute_critic(self, obs: Any) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class ActorCritic(ActorCriticModel):
    """PPO/A2C model: `forward(obs) -> {"logit": [B, action_n], "value": [B]}`, or with
    `continuous=True` {"mu", "log_std": [B, action_n], "value"} (see `ActorCriticHead`).

    Actor and critic get separate encoders by default (CleanRL's PPO: the value loss does not
    disturb the policy features); `share_encoder=True` uses one. Hidden layers (linear and
    convolutional) are orthogonally initialised with gain sqrt(2).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_n: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: Activation = "tanh",
        share_encoder: bool = False,
        continuous: bool = False,
        log_std_init: float = 0.0,
        encoder: str = "auto",
    ) -> None:
        super().__init__()
        self.actor_encoder = self._encoder(observation_space, hidden_sizes, activation, encoder)
        self.critic_encoder = (
            None
            if share_encoder
            else self._encoder(observation_space, hidden_sizes, activation, encoder)
        )
        self.head = ActorCriticHead(
            self.actor_encoder.output_dim, action_n, continuous, log_std_init
        )

    @staticmethod
    def _encoder(
        space: spaces.Space, hidden_sizes: Sequence[int], activation: Activation, kind: str
    ) -> Encoder:
        encoder = make_encoder(space, hidden_sizes, activation, kind)
        for module in encoder.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                layer_init(module)
        return encoder

    @property
    def share_encoder(self) -> bool:
        return self.critic_encoder is None

    def _critic_features(self, obs: Batch) -> torch.Tensor:
        encoder = self.actor_encoder if self.critic_encoder is None else self.critic_encoder
        return encoder(obs)

    def compute_critic(self, obs: Batch) -> dict[str, torch.Tensor]:
        return {"value": self.head.value(self._critic_features(obs)).squeeze(-1)}

    def forward(self, obs: Batch) -> dict[str, torch.Tensor]:
        actor_features = self.actor_encoder(obs)
        if self.critic_encoder is None:  # shared: encode once
            return self.head(actor_features)
        return self.head(actor_features, self.critic_encoder(obs))


def without_aliases(weights: Mapping[str, Any]) -> dict[str, Any]:
    """A model's saved weights without the aliases of checkpoints written before encoders
    followed the observation space: their flat encoder listed its first layer twice (as
    "_first_layer", the same tensors as mlp.net.0)."""
    return {key: value for key, value in weights.items() if "._first_layer." not in key}
