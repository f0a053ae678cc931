"""`Actor`: acting with a policy, the same wherever it runs.

An agent service acts with its policy (`PolicyAgent.do_act`); with local inference an
orchestrator acts with a copy of it next to the env (`mistk_rl.sdk.stepping.LocalStepper`). Both
go through `Actor.act`, so exploration (epsilon at the env step, sampling), the warm-up's
uniform actions, action masks and what the model said for the transition (the extras:
sampled action, log-prob, value) are one piece of code, not two that drift apart.

A copy is built from what the agent describes (`PolicyDescription`: the policy's registered name,
its config, the spaces, the weights); `weights` and `load_weights` move the acting model's
parameters as numpy arrays, which both wire encodings carry. Whatever the agent's device
(`mistk_rl.rl.device`), those arrays are CPU ones and a copy acts on the CPU: the actor
hands the acting policy its rows on that policy's device and brings what it said back.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import numpy as np
import torch

from mistk_rl.rl.data.collate import to_device
from mistk_rl.rl.normalize import Normalizer
from mistk_rl.rl.policies.base import Policy

# the policies a copy can be built of, by name (a name from a remote service is never
# imported as a module path)
POLICIES = {
    "DQNPolicy": "mistk_rl.rl.policies.dqn:DQNPolicy",
    "PPOPolicy": "mistk_rl.rl.policies.ppo:PPOPolicy",
    "ThinkerPPOPolicy": "mistk_rl.thinker.policy:ThinkerPPOPolicy",
}


def policy_class(name: str) -> type[Policy]:
    """The policy class registered under `name` (ValueError naming the known ones)."""
    if name not in POLICIES:
        raise ValueError(
            f"no local copy of policy {name!r} can be built; known: {', '.join(POLICIES)}"
        )
    module, _, cls = POLICIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


class Actor:
    """A policy acting on rows: one forward pass, collect or eval mode.

    `warmup`: the uniformly random policy a replay's first steps use (while `warming_up`);
    `normalizer`: observations are normalised before the policy sees them, with statistics
    that move in collect mode; `keep_obs`: the extras also keep the normalised observation
    (a rollout stores what the policy acted on; a replay stores raw observations)."""

    def __init__(
        self,
        policy: Policy,
        warmup: Optional[Policy] = None,
        normalizer: Optional[Normalizer] = None,
        keep_obs: bool = False,
    ) -> None:
        self.policy, self.warmup, self.normalizer = policy, warmup, normalizer
        self.keep_obs = keep_obs and normalizer is not None and normalizer.norm_obs
        # the outputs a transition needs (PPO: log-prob, value, ...; DQN: none), all that
        # is kept per step (the Q-values of a step, say, would be carried for nothing)
        self.extras = frozenset(policy.transition_extras())

    def act(
        self, obs: Any, mask: Optional[np.ndarray], *, mode: str, env_steps: int, warming_up: bool
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions [N, ...] for the rows of `obs` (an array, or a dict of arrays), and in
        collect mode the extras: the model's per-row outputs its transitions need
        (`Policy.transition_extras`)."""
        obs = (
            {key: torch.as_tensor(column) for key, column in obs.items()}
            if isinstance(obs, dict)
            else torch.as_tensor(obs)
        )
        allowed = None if mask is None else torch.as_tensor(mask)
        normalizer = self.normalizer
        if normalizer is not None and normalizer.norm_obs:
            if mode != "eval":  # eval mode: frozen statistics
                normalizer.update_obs(obs.numpy())
            obs = normalizer.obs(obs)
        if mode == "eval":
            device = self.policy.device
            out = self.policy.eval_mode.forward(to_device(obs, device), to_device(allowed, device))
            return _numpy(out.get("env_action", out["action"])), {}
        actor = self.warmup if warming_up and self.warmup is not None else self.policy
        out = actor.collect_mode.forward(
            to_device(obs, actor.device), to_device(allowed, actor.device), env_steps
        )
        extras = {key: _numpy(value) for key, value in out.items() if key in self.extras}
        if self.keep_obs:
            extras["obs"] = obs.numpy()
        # Box actions: "env_action" is the sample clipped to the bounds, "action" the sample
        return _numpy(out.get("env_action", out["action"])), extras


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A policy's output as an array (from the device, where it acts on one)."""
    return tensor.cpu().numpy()


def weights(policy: Policy) -> dict[str, np.ndarray]:
    """The acting model's parameters and buffers, as arrays (copies)."""
    return {
        name: tensor.detach().cpu().numpy().copy()
        for name, tensor in policy.model.state_dict().items()
    }


def load_weights(policy: Policy, arrays: dict[str, Any]) -> None:
    """Put `weights`' arrays into the acting model; a missing, extra or misshapen one is a
    ValueError naming it (the copy must be of the same architecture)."""
    state = policy.model.state_dict()
    if set(arrays) != set(state):
        raise ValueError(
            f"weights name {sorted(set(arrays) ^ set(state))[:3]} that the "
            f"model does not have, or lack them"
        )
    new = {}
    for name, tensor in state.items():
        value = torch.tensor(np.asarray(arrays[name]), dtype=tensor.dtype)  # (a copy)
        if value.shape != tensor.shape:
            raise ValueError(
                f"weights[{name!r}]: shape {tuple(value.shape)}, the model's is "
                f"{tuple(tensor.shape)}"
            )
        new[name] = value
    policy.model.load_state_dict(new)
