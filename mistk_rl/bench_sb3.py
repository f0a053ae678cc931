"""The in-process bar: Stable-Baselines3 with rl-baselines3-zoo's CartPole-v1 hyperparameters,
evaluated exactly as `mistk-rl run` evaluates (greedy, `eval_episodes` episodes on seeds
eval_seed, eval_seed+1, ..., every `eval_every` env steps, stop at `stop_value`), timed from the
first training step. Needs the `bench` extra (``pip install -e .[bench]``).
"""
from __future__ import annotations

import time
from typing import Any, Optional

import gymnasium as gym
import numpy as np
import torch

# rl-baselines3-zoo hyperparams/{dqn,ppo}.yml, CartPole-v1
ZOO = {
    "dqn": {"n_timesteps": 50_000, "learning_rate": 2.3e-3, "batch_size": 64,
            "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99,
            "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
            "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
            "policy_kwargs": {"net_arch": [256, 256]}},
    "ppo": {"n_timesteps": 100_000, "n_envs": 8, "n_steps": 32, "batch_size": 256,
            "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
            "learning_rate": "lin_0.001", "clip_range": "lin_0.2"},
}


def evaluate(policy_predict, episodes: int, seed: int, env_id: str = "CartPole-v1") -> list:
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            action = policy_predict(obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def run_sb3(algo: str, seed: int, eval_every: int, eval_episodes: int = 10,
            eval_seed: int = 10_000, stop_value: float = 475.0,
            env_steps: Optional[int] = None) -> dict[str, Any]:
    try:
        from stable_baselines3 import DQN, PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError as exc:
        raise SystemExit("bench sb3 needs stable-baselines3: pip install -e '.[bench]'") from exc

    torch.set_num_threads(1)  # as our services run; the machines have 2 cores
    hp = dict(ZOO[algo])
    budget = env_steps or hp.pop("n_timesteps")
    hp.pop("n_timesteps", None)
    evals: list[dict] = []
    started = time.monotonic()

    class EvalEvery(BaseCallback):
        next_eval = eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += eval_every
            returns = evaluate(lambda o: int(self.model.predict(o, deterministic=True)[0]),
                               eval_episodes, eval_seed)
            evals.append({"env_steps": int(self.num_timesteps),
                          "wall_s": round(time.monotonic() - started, 3),
                          "mean_return": float(np.mean(returns)), "returns": returns})
            return evals[-1]["mean_return"] < stop_value

    if algo == "dqn":
        model = DQN("MlpPolicy", gym.make("CartPole-v1"), seed=seed, verbose=0, **hp)
    else:
        n_envs = hp.pop("n_envs")
        lr, clip = (float(hp.pop(k).split("_")[1]) for k in ("learning_rate", "clip_range"))
        model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=n_envs, seed=seed),
                    seed=seed, verbose=0, learning_rate=lambda p: p * lr,
                    clip_range=lambda p: p * clip, **hp)
    started = time.monotonic()
    model.learn(total_timesteps=budget, callback=EvalEvery())
    wall = time.monotonic() - started
    success = next((e for e in evals if e["mean_return"] >= stop_value), None)
    return {"bench": f"sb3_{algo}", "seed": seed, "evals": evals, "wall_s": round(wall, 3),
            "first_success": success and {k: success[k] for k in
                                          ("env_steps", "wall_s", "mean_return")}}
