"""An actor-critic that reads the Thinker MDP's tree: what a PPO agent plans with.

The observation is ``{"tree_reps", "real_states"}`` and the action one of Discrete(2A),
``reset * A + primary``. A plain MLP over the 9 + 10A + K tree statistics must learn, for each
of the A actions apart, that a high ``root_qs_max`` (the best return found below it) is worth
taking; PPO's reward, one real step in K, teaches that slowly (the seed's probe: .22 solved
against the scripted readout's .42). Two things the tree's structure gives for free:

- **A per-action readout.** Each primary action a has its own slice of the statistics (the
  root's and the current node's child a: prior logit, mean and max return, visit share); one
  small MLP, shared by all actions, maps that slice and the stage's context (whether the next
  step is real, the depth) to a logit bonus for a and for a-then-reset. Shared weights mean
  "prefer the child whose search found more" is learnt once for every action, the way a
  convolution learns a pattern once for every place. Its last layer starts at zero, so the
  policy starts as the trunk's (near uniform).
- **Real steps cannot reset.** A real step's reset has no effect (the root is re-visited), so
  its A reset actions are masked there, as the paper's actor masks them: no probability is
  spent telling apart two actions that do the same.

The trunk is the usual one: the real frame and the whole tree_reps vector through MLPs (or
``encoder: conv`` for the frame), concatenated, then the policy and value heads; the critic
has its own trunk, as `mistk_rl.rl.models.ActorCritic`'s default. The paper's actor adds a
recurrent core; within a stage the tree statistics already hold what a memory would (every
visit is in them), so this one is feed-forward.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from gymnasium import spaces
from torch import nn

from mistk_rl.rl.encoders import MLP, Activation, layer_init, make_encoder
from mistk_rl.rl.models import ActorCriticModel
from mistk_rl.thinker.tree import Layout

PER_ACTION = (
    "root_logits",
    "root_qs_mean",
    "root_qs_max",
    "root_ns",
    "cur_logits",
    "cur_qs_mean",
    "cur_qs_max",
    "cur_ns",
)
"""The fields of tree_reps with one value per primary action: the readout's input."""


def thinker_spaces(space: spaces.Space, action_n: int) -> tuple[int, int]:
    """(A, K) of a Thinker MDP's observation space and Discrete(2A) action count; ValueError
    for anything else."""
    if not (isinstance(space, spaces.Dict) and {"tree_reps", "real_states"} <= set(space.spaces)):
        raise ValueError(
            f"a Thinker actor-critic reads {{'tree_reps', 'real_states'}}, not {space}"
        )
    if action_n % 2:
        raise ValueError(f"a Thinker actor-critic acts in Discrete(2A), not {action_n} actions")
    a, length = action_n // 2, _reps_length(space)
    k = length - 9 - 10 * a
    if k < 1:
        raise ValueError(
            f"tree_reps of length {length} does not fit {a} primary actions: N = 9 + 10A + K"
        )
    return a, k


def _reps_length(space: spaces.Dict) -> int:
    """N, the length of the observation's tree_reps."""
    reps = space["tree_reps"]
    if not isinstance(reps, spaces.Box):
        raise ValueError(f"a Thinker actor-critic reads tree_reps as a Box, not {reps}")
    return int(reps.shape[-1])


class TreeTrunk(nn.Module):
    """Features of one observation: the real frame's encoder and an MLP over tree_reps,
    concatenated, then one more layer. With ``xs`` (the MDP's ``return_x``: the frame of the
    node the imagination stands on) the same frame encoder reads that frame too: where the
    walk is, so imagination can be steered by what the board shows, as the paper's agent
    reads its model's predicted frames."""

    def __init__(
        self, space: spaces.Dict, hidden_sizes: Sequence[int], activation: Activation, encoder: str
    ) -> None:
        super().__init__()
        self.frame = make_encoder(space["real_states"], hidden_sizes, activation, encoder)
        self.frames = ("real_states", "xs") if "xs" in space.spaces else ("real_states",)
        self.tree = MLP(_reps_length(space), hidden_sizes, activation)
        self.joint = MLP(
            len(self.frames) * self.frame.output_dim + self.tree.output_dim,
            hidden_sizes[-1:],
            activation,
        )
        self.output_dim = self.joint.output_dim
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                layer_init(module)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        frames = [self.frame(obs[key]) for key in self.frames]
        return self.joint(torch.cat([*frames, self.tree(obs["tree_reps"].float())], dim=1))


class ThinkerActorCritic(ActorCriticModel):
    """`forward(obs) -> {"logit": [B, 2A], "value": [B]}`, the interface of
    `mistk_rl.rl.models.ActorCritic` (module doc)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_n: int,
        hidden_sizes: Sequence[int] = (128, 128),
        activation: Activation = "tanh",
        encoder: str = "auto",
        readout_hidden: int = 32,
        reset_logit: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_actions, rec_t = thinker_spaces(observation_space, action_n)
        assert isinstance(observation_space, spaces.Dict)  # (thinker_spaces checked it)
        slices = Layout(self.num_actions, rec_t).slices
        self._per_action = [slices[name] for name in PER_ACTION]
        self._next_real = slices["time"].stop - 1  # the stage's counter is at K - 1
        self._derec = slices["derec"].start  # gamma ** depth
        self.actor_trunk = TreeTrunk(observation_space, hidden_sizes, activation, encoder)
        self.critic_trunk = TreeTrunk(observation_space, hidden_sizes, activation, encoder)
        self.policy = layer_init(nn.Linear(self.actor_trunk.output_dim, action_n), gain=0.01)
        self.value = layer_init(nn.Linear(self.critic_trunk.output_dim, 1), gain=1.0)
        # per action: its statistics and the two context values -> (walk on, walk and reset)
        self.readout = MLP(len(PER_ACTION) + 2, [readout_hidden], activation, out_dim=2)
        first, last = self.readout.net[0], self.readout.net[-1]
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)  # (MLP's layers)
        layer_init(first)
        layer_init(last, gain=0.0)
        with torch.no_grad():  # the reset half's starting logit, relative to walking on
            last.bias[1] = reset_logit

    def _readout(self, reps: torch.Tensor) -> torch.Tensor:
        """The shared per-action bonus [B, 2A] (the reset half after the walk-on half)."""
        a = self.num_actions
        stats = torch.stack([reps[:, s] for s in self._per_action], dim=-1)  # [B, A, F]
        context = torch.stack([reps[:, self._next_real], reps[:, self._derec]], dim=-1)
        x = torch.cat([stats, context.unsqueeze(1).expand(-1, a, -1)], dim=-1)
        bonus = self.readout(x)  # [B, A, 2]
        return torch.cat([bonus[..., 0], bonus[..., 1]], dim=1)

    def actor(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        reps = obs["tree_reps"].float()
        logits = self.policy(self.actor_trunk(obs)) + self._readout(reps)
        real = reps[:, self._next_real] > 0.5
        reset_half = torch.zeros_like(logits, dtype=torch.bool)
        reset_half[:, self.num_actions :] = True
        return logits.masked_fill(reset_half & real.unsqueeze(1), float("-inf"))

    def compute_critic(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"value": self.value(self.critic_trunk(obs)).squeeze(-1)}

    def forward(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"logit": self.actor(obs), **self.compute_critic(obs)}
