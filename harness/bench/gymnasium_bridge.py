"""`mistk-rl bench gymnasium`: SB3's PPO trained on CartPole-v1 through the gymnasium bridge
(`mistk_rl.bridges.gymnasium_env`: a gym orchestrator this bench starts, its copies as one
SB3 VecEnv, `mistk_rl.bridges.gymnasium_sb3`), against the same PPO on gymnasium's CartPole
in this process (SB3's DummyVecEnv), seed by seed.

The hyperparameters are rl-zoo's for CartPole PPO (`RL_ZOO_PPO`: 8 envs, 32 steps, batch
256, GAE 0.8, gamma 0.98, 20 epochs, no entropy bonus, learning rate and clip range linear
from 1e-3 and 0.2). Both sides are evaluated alike: every `eval_every` env steps (at the end
of the rollout that crosses it) the deterministic policy plays `eval_episodes` episodes of
an in-process CartPole-v1 (seeds 10_000, 10_001, ...); training stops at the first mean
return of `stop_value`, or at `budget` env steps. Each record says the env steps and the
training wall time (evaluations not counted) to that evaluation. The bridge replays
gymnasium's CartPole exactly (the same seeds give the same observations: tests say so), so
with one seed the two runs see the same data and should need the same steps; what differs
is the time a step takes.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

RL_ZOO_PPO: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
}
RL_ZOO_ENVS = 8
EVAL_SEED = 10_000


@dataclass
class _Clock:
    """Training wall time: the run's, less the time its evaluations took."""

    started: float = field(default_factory=time.perf_counter)
    in_evals: float = 0.0

    def training_s(self) -> float:
        return time.perf_counter() - self.started - self.in_evals


def _linear(start: float) -> Callable[[float], float]:
    """rl-zoo's ``lin_X``: X times the progress remaining (1 -> 0)."""
    return lambda remaining: remaining * start


def _evaluator(model: Any, episodes: int) -> float:
    """Mean return of the deterministic policy on `episodes` seeded CartPole-v1 episodes."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + k)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def _callback(
    clock: _Clock, evals: list[dict], every: int, episodes: int, stop_value: float
) -> Any:
    """An SB3 callback: evaluate at the end of each rollout that crosses a multiple of
    `every` env steps; training stops at the first step after a mean of `stop_value`."""
    from stable_baselines3.common.callbacks import BaseCallback

    class _Evaluate(BaseCallback):
        reached = False

        def _on_step(self) -> bool:
            return not self.reached

        def _on_rollout_end(self) -> None:
            rollout = self.training_env.num_envs * RL_ZOO_PPO["n_steps"]
            steps = self.num_timesteps
            if steps // every <= (steps - rollout) // every:
                return
            began = time.perf_counter()
            mean = _evaluator(self.model, episodes)
            clock.in_evals += time.perf_counter() - began
            evals.append({"env_steps": steps, "mean_return": mean, "train_s": clock.training_s()})
            self.reached = mean >= stop_value

    return _Evaluate()


def _vec_env(where: str, seed: int) -> Any:
    """The 8 CartPole copies: in this process (DummyVecEnv), or a started gym orchestrator's
    through the bridge."""
    if where == "in_process":
        from stable_baselines3.common.env_util import make_vec_env

        return make_vec_env("CartPole-v1", n_envs=RL_ZOO_ENVS, seed=seed)
    from mistk_rl.bridges.gymnasium_env import OrchestratorVectorEnv
    from mistk_rl.bridges.gymnasium_sb3 import OrchestratorVecEnv

    return OrchestratorVecEnv(OrchestratorVectorEnv({"id": "CartPole-v1"}, num_envs=RL_ZOO_ENVS))


def run_one(
    where: str, seed: int, budget: int, eval_every: int, eval_episodes: int, stop_value: float
) -> dict[str, Any]:
    """One PPO run (module doc): its evaluations, and the steps and time to `stop_value`."""
    from stable_baselines3 import PPO

    env = _vec_env(where, seed)
    try:
        model = PPO(
            "MlpPolicy",
            env,
            learning_rate=_linear(1e-3),
            clip_range=_linear(0.2),
            seed=seed,
            device="cpu",
            verbose=0,
            **RL_ZOO_PPO,
        )
        evals: list[dict] = []
        clock = _Clock()
        model.learn(budget, callback=_callback(clock, evals, eval_every, eval_episodes, stop_value))
        train_s = clock.training_s()
        steps = int(model.num_timesteps)
    finally:
        env.close()
    reached = next((e for e in evals if e["mean_return"] >= stop_value), None)
    return {
        "bench": "gymnasium",
        "where": where,
        "seed": seed,
        "env_steps": steps,
        "train_s": round(train_s, 2),
        "steps_per_s": round(steps / train_s, 1),
        "steps_to_target": None if reached is None else reached["env_steps"],
        "train_s_to_target": None if reached is None else round(reached["train_s"], 2),
        "final_eval": evals[-1]["mean_return"] if evals else None,
        "evals": evals,
    }


def summarize(records: list[dict]) -> list[dict]:
    """Per side: the seeds that reached the target, and the mean steps and time to it."""
    rows = []
    for where in ("in_process", "bridge"):
        mine = [r for r in records if r["where"] == where]
        hit = [r for r in mine if r["steps_to_target"] is not None]
        rows.append(
            {
                "where": where,
                "seeds": len(mine),
                "reached": len(hit),
                "mean_steps_to_target": _mean([r["steps_to_target"] for r in hit]),
                "mean_train_s_to_target": _mean([r["train_s_to_target"] for r in hit]),
                "mean_steps_per_s": _mean([r["steps_per_s"] for r in mine]),
            }
        )
    return rows


def _mean(values: list[float]) -> Optional[float]:
    return round(float(np.mean(values)), 2) if values else None


def table(records: list[dict], summary: list[dict], stop_value: float) -> str:
    lines = [
        f"{'where':<11} {'seed':>4} {'steps to ' + str(stop_value):>15} {'train s to it':>14} "
        f"{'steps/s':>9} {'final eval':>10}"
    ]
    for r in records:
        lines.append(
            f"{r['where']:<11} {r['seed']:>4} {str(r['steps_to_target']):>15} "
            f"{str(r['train_s_to_target']):>14} {r['steps_per_s']:>9} {str(r['final_eval']):>10}"
        )
    for s in summary:
        lines.append(
            f"{s['where']:<11} mean ({s['reached']}/{s['seeds']} reached): "
            f"{s['mean_steps_to_target']} steps, {s['mean_train_s_to_target']} s, "
            f"{s['mean_steps_per_s']} steps/s"
        )
    return "\n".join(lines)


def bench_gymnasium(
    seeds: tuple[int, ...] = (0, 1, 2),
    budget: int = 100_000,
    eval_every: int = 2048,
    eval_episodes: int = 20,
    stop_value: float = 475.0,
    torch_threads: int = 1,
    out: Optional[Path] = None,
) -> list[dict]:
    """The bench (module doc): a record per side and seed, printed as a table; with `out`,
    written as JSON (`{"machine", "settings", "records", "summary"}`)."""
    import torch

    torch.set_num_threads(torch_threads)
    records = [
        run_one(where, seed, budget, eval_every, eval_episodes, stop_value)
        for seed in seeds
        for where in ("in_process", "bridge")
    ]
    summary = summarize(records)
    print(table(records, summary, stop_value))
    if out is not None:
        settings = {
            "ppo": RL_ZOO_PPO,
            "n_envs": RL_ZOO_ENVS,
            "learning_rate": "linear 1e-3",
            "clip_range": "linear 0.2",
            "budget": budget,
            "eval_every": eval_every,
            "eval_episodes": eval_episodes,
            "stop_value": stop_value,
            "torch_threads": torch_threads,
        }
        payload = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "settings": settings,
            "records": records,
            "summary": summary,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2) + "\n")
    return records
