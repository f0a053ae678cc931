"""Evaluation that is not biased towards short episodes.

With E envs running in parallel, the first N finished episodes over-represent short ones (a
policy that fails fast finishes more episodes in the same time). `EpisodeQuota` gives each
env a fixed quota (N // E, the remainder to the first envs) and ignores episodes beyond it,
so the mean is over the same episodes whatever their lengths. `Evaluator` runs a policy's
eval mode on a gymnasium vector env with that rule and reports stop once the mean reaches
`stop_value`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import gymnasium as gym
import numpy as np



def split_episodes(n_episodes: int, n_envs: int) -> list[int]:
    """`n_episodes` spread evenly over `n_envs` (the remainder to the first envs)."""
    base, extra = divmod(n_episodes, n_envs)
    return [base + (1 if i < extra else 0) for i in range(n_envs)]


class EpisodeQuota:
    """Which finished episodes count towards an evaluation of `n_episodes` over `n_envs`."""

    def __init__(self, n_episodes: int, n_envs: int) -> None:
        if n_episodes < n_envs:
            raise ValueError(f"{n_episodes} eval episodes cannot cover {n_envs} envs: "
                             "use at least one episode per env")
        self.quota = split_episodes(n_episodes, n_envs)
        self.returns: list[list[float]] = [[] for _ in range(n_envs)]

    def add(self, env_id: int, episode_return: float) -> bool:
        """Record a finished episode; False if that env has filled its quota already."""
        if len(self.returns[env_id]) >= self.quota[env_id]:
            return False
        self.returns[env_id].append(float(episode_return))
        return True

    @property
    def done(self) -> bool:
        return all(len(r) >= q for r, q in zip(self.returns, self.quota))

    def all_returns(self) -> list[float]:
        return [x for per_env in self.returns for x in per_env]


@dataclass
class EvalResult:
    mean_return: float
    std_return: float
    returns: list[float] = field(default_factory=list)
    stop: bool = False  # the mean reached stop_value


def summarize(returns: list[float], stop_value: Optional[float]) -> EvalResult:
    mean = float(np.mean(returns)) if returns else float("nan")
    std = float(np.std(returns)) if returns else float("nan")
    return EvalResult(mean, std, list(returns), stop_value is not None and mean >= stop_value)


class Evaluator:
    """Runs `eval_forward` (a policy's eval_mode.forward) on `env_fns` until each env has
    finished its quota of episodes."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]], n_episodes: int = 10,
                 stop_value: Optional[float] = None, max_steps: int = 100_000) -> None:
        self.envs = gym.vector.SyncVectorEnv(
            env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.n_episodes, self.stop_value, self.max_steps = n_episodes, stop_value, max_steps

    def eval(self, eval_forward: Callable, seed: Optional[int] = None) -> EvalResult:
        import torch  # (here: the orchestrators use this module's quotas, not torch)

        quota = EpisodeQuota(self.n_episodes, self.envs.num_envs)
        obs, _ = self.envs.reset(seed=seed)
        running = np.zeros(self.envs.num_envs)
        for _ in range(self.max_steps):
            with torch.no_grad():  # raw observations: the policy encodes them itself
                out = eval_forward(torch.as_tensor(obs), None)
            obs, rewards, terminated, truncated, _ = self.envs.step(out["action"].numpy())
            running += rewards
            for env_id in np.flatnonzero(terminated | truncated):
                quota.add(int(env_id), running[env_id])
                running[env_id] = 0.0
            if quota.done:
                break
        return summarize(quota.all_returns(), self.stop_value)

    def close(self) -> None:
        self.envs.close()
