"""Observation and reward normalisation with SB3 `VecNormalize` semantics.

- observations: running mean and variance over every observation acted on (Chan et al.'s
  parallel update, one batch per getAction), normalised as
  clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs);
- rewards: divided by the running std of the discounted return
  (ret <- ret * gamma + r per entity, reset when its episode ends), clipped to
  +-clip_reward. The mean is not subtracted: that would change which policy is optimal.

Statistics move only when `update` is asked for (the agent does so in collect mode, never in
eval mode) and go into the agent's checkpoint (`state_dict`). Where the agent applies them,
and why on-policy and off-policy learners store different things, is in `PolicyAgent`'s
module doc.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
import torch


class RunningMeanStd:
    """Mean and (population) variance of a stream of batches [N, *shape].

    Starts from count 0, so after any sequence of batches `mean`/`var` equal numpy's over
    their concatenation (SB3 starts at count 1e-4 to dodge a division by zero that count 0
    does not meet here: a first batch just sets the statistics)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 0

    def update(self, batch: np.ndarray) -> None:
        batch = np.asarray(batch, np.float64)
        n = batch.shape[0]
        if n == 0:
            return
        batch_mean, batch_var = batch.mean(axis=0), batch.var(axis=0)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], np.float64).copy()
        self.var = np.asarray(state["var"], np.float64).copy()
        self.count = int(state["count"])


class Normalizer:
    """The agent's observation and reward normaliser, built from the `normalize` config:
    `{obs, reward, clip_obs, clip_reward, gamma, epsilon}` (gamma: the return's discount)."""

    def __init__(self, config: Mapping[str, Any], obs_shape: tuple[int, ...], gamma: float) -> None:
        self.norm_obs, self.norm_reward = bool(config["obs"]), bool(config["reward"])
        self.clip_obs, self.clip_reward = float(config["clip_obs"]), float(config["clip_reward"])
        self.epsilon = float(config["epsilon"])
        self.gamma = float(config["gamma"] if config["gamma"] is not None else gamma)
        self.obs_rms = RunningMeanStd(tuple(obs_shape))
        self.ret_rms = RunningMeanStd(())
        self._returns: dict[str, float] = {}  # entity -> discounted return so far

    # ---- observations --------------------------------------------------------------------
    def update_obs(self, batch: np.ndarray) -> None:
        if self.norm_obs:
            self.obs_rms.update(batch)

    def obs(self, obs: Any) -> Any:
        """`obs` (one or a batch; numpy or torch) normalised; unchanged when obs is off."""
        if not self.norm_obs:
            return obs
        if isinstance(obs, torch.Tensor):
            mean = torch.as_tensor(self.obs_rms.mean, dtype=torch.float32)
            std = torch.as_tensor(np.sqrt(self.obs_rms.var + self.epsilon), dtype=torch.float32)
            return ((obs.float() - mean) / std).clamp(-self.clip_obs, self.clip_obs)
        out = (np.asarray(obs, np.float64) - self.obs_rms.mean) / np.sqrt(
            self.obs_rms.var + self.epsilon
        )
        return np.clip(out, -self.clip_obs, self.clip_obs).astype(np.float32)

    # ---- rewards -------------------------------------------------------------------------
    def update_rewards(self, rewards: Mapping[str, float], dones: Mapping[str, bool]) -> None:
        """One env step of each entity: fold its reward into its discounted return, update
        the return statistics with all of them, then forget the returns of ended episodes."""
        if not self.norm_reward:
            return
        returns = [self._returns.get(e, 0.0) * self.gamma + float(r) for e, r in rewards.items()]
        self._returns.update(zip(rewards, returns))
        self.ret_rms.update(np.asarray(returns))
        for entity, done in dones.items():
            if done:
                self._returns.pop(entity, None)

    def end_episodes(self) -> None:
        """Episodes cut without a done flag (the agent's episode stopped): returns restart."""
        self._returns.clear()

    def reward(self, reward: Any) -> Any:
        """`reward` (a float, array or tensor) scaled; unchanged when reward is off."""
        if not self.norm_reward:
            return reward
        scale = float(np.sqrt(self.ret_rms.var + self.epsilon))
        if isinstance(reward, torch.Tensor):
            return (reward / scale).clamp(-self.clip_reward, self.clip_reward)
        return np.clip(np.asarray(reward, np.float64) / scale, -self.clip_reward, self.clip_reward)

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The statistics; the per-entity returns are left out: the episodes they belong to
        do not outlive a checkpoint (the trainers end them too)."""
        return {"obs": self.obs_rms.state_dict(), "ret": self.ret_rms.state_dict()}

    def load_state_dict(self, state: Optional[Mapping[str, Any]]) -> None:
        if state is None:  # a checkpoint written without normalisation: start from scratch
            return
        self.obs_rms.load_state_dict(state["obs"])
        self.ret_rms.load_state_dict(state["ret"])
        self._returns.clear()
