"""Typed batches: what a replay buffer or a rollout hands to a policy's learn step.

One type per kind of batch, as Stable-Baselines3's `ReplayBufferSamples` and
`RolloutBufferSamples`: a learner reads named fields, and a batch that lacks one fails where it
is built, not as a silent `.get` default deep in an update. Observations are a `Batch`: a
tensor, or for a Dict space a dict of tensors (one per key). Rows line up across fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Optional, Union

import torch

from mistk_rl.rl.data.collate import Batch

# a sample's replay-buffer meta keys that become fields; the others (slot, priority, use,
# staleness) are the buffer's bookkeeping, read through `sample` and `stats`
_META_FIELDS = {"IS": "weight", "replay_unique_id": "ids"}
_BOOKKEEPING = {"replay_buffer_idx", "priority", "use", "staleness"}


class ReplaySamples(NamedTuple):
    """Transitions drawn from a replay buffer (n-step ones: `OffPolicyTrainer` accumulates
    them): an off-policy learner's minibatch of B rows."""

    obs: Batch  # s_t, raw: a normalising trainer normalises a copy of each sample
    action: torch.Tensor  # a_t [B]
    reward: torch.Tensor  # [B] the window's discounted reward sum (one step: r_t)
    next_obs: Batch  # the state the target bootstraps from, s_{t+n}
    terminated: torch.Tensor  # [B] the MDP ended inside the window: no bootstrap
    truncated: Optional[torch.Tensor] = None  # [B] cut by a time limit: bootstrap anyway
    gamma_n: Optional[torch.Tensor] = None  # [B] discount to next_obs, gamma^steps; None: 1 step
    next_action_mask: Optional[torch.Tensor] = None  # [B, A] legal actions of next_obs; None: all
    weight: Optional[torch.Tensor] = None  # [B] importance weights (prioritized); None: all 1
    ids: Optional[torch.Tensor] = None  # [B] the buffer's unique ids, for priority feedback

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> ReplaySamples:
        """From a buffer's collated columns: the transitions' keys and the sample's meta keys
        (`IS` is the weight, `replay_unique_id` the id)."""
        fields = {
            _META_FIELDS.get(key, key): value
            for key, value in columns.items()
            if key not in _BOOKKEEPING
        }
        unknown = fields.keys() - cls._fields
        missing = {"obs", "action", "reward", "next_obs", "terminated"} - fields.keys()
        if unknown or missing:
            raise ValueError(
                f"replayed transitions do not fit ReplaySamples: "
                f"missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        return cls(**fields)


class RolloutSamples(NamedTuple):
    """An on-policy rollout with its GAE targets, every entity's steps one after another:
    PPO's update batch of B rows."""

    obs: Batch  # s_t as the policy saw it (normalised when the agent normalises)
    action: torch.Tensor  # the sampled action, [B] or [B, d] (Box: before clipping)
    log_prob: torch.Tensor  # [B] log pi_old(a_t | s_t), when acting
    value: torch.Tensor  # [B] V_old(s_t), when acting
    advantage: torch.Tensor  # [B] GAE(gamma, lambda)
    returns: torch.Tensor  # [B] advantage + value: the value target
    action_mask: Optional[torch.Tensor] = None  # [B, A] the actions allowed when acting; None: all
    env_steps: int = 0  # env steps collected when the rollout ended: annealing's clock


Samples = Union[ReplaySamples, RolloutSamples]
"""What a learn step takes."""
