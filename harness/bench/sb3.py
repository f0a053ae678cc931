"""Stable-Baselines3 in-process, configured from one of our training configs and evaluated
exactly as `mistk-rl run` evaluates it (greedy, `eval_episodes` episodes on seeds eval_seed,
eval_seed+1, ..., every `eval_every` env steps, stop at `stop_value` or at `env_steps`), timed
from the first training step, on the CPU. Needs the `bench` extra (``pip install -e .[bench]``).

`sb3_setup` is the one place our config keys become SB3's: it reads the agent's *merged*
config (our defaults included), so every value our agent trains with is handed to SB3, and a
value SB3 cannot express (double Q, a dueling head, ...) is an error naming it rather than a
silent difference.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import gymnasium as gym
import numpy as np
import torch

from harness.config import RunConfig, TrainingSpec
from harness.training import first_success
from mistk_rl.rl import pacing
from mistk_rl.rl.config import AgentConfigError
from mistk_rl.rl.policies.base import Policy

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecEnv, VecNormalize

# the agents' keys with no bearing on what is learned (logging, checkpoints, threads, the
# device: SB3's side runs on the CPU, see `run_sb3`)
NOT_LEARNING = {
    "seed",
    "log_every",
    "checkpoint_every",
    "checkpoint_buffer",
    "torch_threads",
    "device",
}
# `normalize` keys (VecNormalize's semantics) -> VecNormalize kwargs
NORMALIZE = {
    "obs": "norm_obs",
    "reward": "norm_reward",
    "clip_obs": "clip_obs",
    "clip_reward": "clip_reward",
    "epsilon": "epsilon",
    "gamma": "gamma",
}
ACTIVATIONS = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}


class Unmappable(ValueError):
    """A config value that SB3 cannot express."""


@dataclass
class Sb3Setup:
    """What SB3 is built from: the algorithm, the env, the constructor's kwargs."""

    algo: str  # "dqn" | "ppo"
    env_id: str
    env_kwargs: dict[str, Any]
    n_envs: int
    budget: int
    kwargs: dict[str, Any]
    normalize: Optional[dict[str, Any]] = None  # VecNormalize kwargs, or None
    pending: Optional[str] = None  # why our agent cannot take this config yet


class AgentClass(Protocol):
    """What the bench reads of a policy agent's class (`agents.policy_agent.PolicyAgent`):
    its config merged over its defaults, and the policy it builds."""

    policy_cls: type[Policy]

    def compile_config(self, hparams: Optional[dict]) -> dict: ...


def trained_agent_class(config: RunConfig) -> AgentClass:
    """The class of the agent a training config trains, imported here from its `target`
    (the bench builds its config and policy in-process)."""
    target = config.agents[0].target
    assert target is not None, "a benched agent is started from its target"
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _training(config: RunConfig) -> TrainingSpec:
    """The config's training section: SB3 trains only on what a training run would."""
    if config.training is None:
        raise AgentConfigError(f"config {config.name!r} has no training section")
    return config.training


def merged_agent_config(config: RunConfig) -> tuple[dict, Optional[str]]:
    """The training agent's config merged over its defaults, and why our agent cannot take
    it yet (None when it can). A `normalize` section our agent does not know yet is kept as
    written, so SB3's side can still be set up."""
    cls = trained_agent_class(config)
    hp = dict(config.agents[0].hyperparameters)
    try:
        return cls.compile_config(hp), None
    except AgentConfigError as exc:
        if "normalize" not in hp:
            raise
        normalize = hp.pop("normalize")
        merged = cls.compile_config(hp)
        merged["normalize"] = normalize
        return merged, f"our agent does not take the config yet: {exc}"


def sb3_setup(config: RunConfig) -> Sb3Setup:
    """SB3's algorithm and kwargs for a training config (module doc)."""
    spec = _training(config)
    merged, pending = merged_agent_config(config)
    algo = trained_agent_class(config).policy_cls.__name__.removesuffix("Policy")
    algo = algo.lower()
    if algo not in ("dqn", "ppo"):
        raise Unmappable(f"no SB3 counterpart for {algo}")
    cfg = dict(merged)
    for key in NOT_LEARNING:
        cfg.pop(key, None)
    if cfg.pop("augment", None) is not None:
        raise Unmappable("augment: SB3 stores transitions as they come (no board symmetries)")
    normalize = _normalize(cfg.pop("normalize", None), merged["policy"]["learn"]["gamma"])
    cfg["train"] = dict(cfg["train"])
    for key in pacing.config():  # when the updates run, not which: SB3 runs a burst at once
        cfg["train"].pop(key)
    mapper = _dqn_kwargs if algo == "dqn" else _ppo_kwargs
    kwargs = mapper(cfg, spec.num_envs, spec.env_steps)
    env = config.orchestrator.env
    return Sb3Setup(
        algo, env.id, dict(env.kwargs), spec.num_envs, spec.env_steps, kwargs, normalize, pending
    )


def _take(tree: dict, path: str) -> Any:
    """Remove and return tree[a][b]... for "a.b..."; `_done` then checks nothing is left."""
    *parents, leaf = path.split(".")
    node = tree
    for key in parents:
        node = node[key]
    return node.pop(leaf)


def _done(tree: dict, prefix: str = "") -> None:
    """Every key of the merged config must have been mapped (an empty mapping is done)."""
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            _done(value, path)
        else:
            raise Unmappable(f"{path} = {value!r} has no SB3 mapping in harness.bench.sb3")


def _require(value: Any, wanted: Any, path: str, why: str) -> None:
    if value != wanted:
        raise Unmappable(f"{path} = {value!r}: SB3 {why} (use {wanted!r} for a parity run)")


def _net(model: dict, algo: str) -> dict:
    _require(
        model.pop("encoder"),
        "auto",
        "policy.model.encoder",
        "picks its encoder by the space (MlpPolicy)",
    )
    activation = model.pop("activation")
    if activation not in ACTIVATIONS:
        raise Unmappable(f"policy.model.activation = {activation!r}: no SB3 mapping")
    sizes = list(model.pop("hidden_sizes"))
    return {
        "net_arch": sizes if algo == "dqn" else {"pi": sizes, "vf": sizes},
        "activation_fn": ACTIVATIONS[activation],
    }


def _dqn_kwargs(cfg: dict, n_envs: int, budget: int) -> dict:
    learn = cfg["policy"]["learn"]
    _require(
        _take(cfg, "policy.model.dueling"), False, "policy.model.dueling", "DQN has no dueling head"
    )
    _require(
        _take(cfg, "policy.learn.double"),
        False,
        "policy.learn.double",
        "DQN is not double Q-learning",
    )
    _require(_take(cfg, "policy.learn.loss"), "huber", "policy.learn.loss", "DQN's loss is Huber")
    _require(
        _take(cfg, "policy.learn.target.update"),
        "hard",
        "policy.learn.target.update",
        "DQN's target sync is mapped for hard updates only",
    )
    _take(cfg, "policy.learn.target.tau")  # soft updates only
    _require(_take(cfg, "buffer.type"), "naive", "buffer.type", "replay is uniform")
    buffer_size = _take(cfg, "buffer.replay_buffer_size")
    for key in list(cfg["buffer"]):  # the advanced buffer's keys are refused above
        _take(cfg, f"buffer.{key}")
    eps = cfg["policy"]["collect"]["eps"]
    _require(eps.pop("type"), "linear", "policy.collect.eps.type", "decays epsilon linearly")
    train_freq, gradient_steps = _take(cfg, "train.train_freq"), _take(cfg, "train.gradient_steps")
    if train_freq % n_envs:
        raise Unmappable(
            f"train.train_freq {train_freq} is not a multiple of num_envs "
            f"{n_envs}: SB3 counts it in steps of all env copies"
        )
    grad_clip = learn.pop("grad_clip")
    kwargs = {
        "learning_rate": learn.pop("lr"),
        "batch_size": learn.pop("batch_size"),
        "gamma": learn.pop("gamma"),
        "buffer_size": buffer_size,
        "learning_starts": _take(cfg, "train.learning_starts"),
        # SB3: train_freq in steps of the vector env, gradient_steps per train
        "train_freq": train_freq // n_envs,
        "gradient_steps": gradient_steps,
        # ours counts target syncs in updates, SB3 in env steps
        "target_update_interval": max(
            1, round(learn["target"].pop("every") * train_freq / gradient_steps)
        ),
        "exploration_initial_eps": eps.pop("start"),
        "exploration_final_eps": eps.pop("end"),
        "exploration_fraction": eps.pop("duration") / budget,
        "max_grad_norm": float("inf") if grad_clip is None else grad_clip,
        "policy_kwargs": _net(cfg["policy"]["model"], "dqn"),
    }
    nstep = _take(cfg, "policy.nstep")
    if nstep != 1:  # SB3 >= 2.6
        kwargs["n_steps"] = nstep
    _done(cfg)
    return kwargs


def _ppo_kwargs(cfg: dict, n_envs: int, budget: int) -> dict:
    learn = cfg["policy"]["learn"]
    _require(
        _take(cfg, "policy.model.share_encoder"),
        False,
        "policy.model.share_encoder",
        "PPO's MlpPolicy keeps separate actor and critic networks",
    )
    rollout = _take(cfg, "train.n_steps")
    if rollout % n_envs:
        raise Unmappable(
            f"train.n_steps {rollout} is not a multiple of num_envs {n_envs}: "
            "SB3's n_steps is per env copy"
        )
    lr, clip, anneal = learn.pop("lr"), learn.pop("clip"), learn.pop("anneal_env_steps")
    kwargs = {
        "n_steps": rollout // n_envs,
        "batch_size": learn.pop("batch_size"),
        "n_epochs": learn.pop("epochs"),
        "gamma": learn.pop("gamma"),
        "gae_lambda": learn.pop("gae_lambda"),
        "ent_coef": learn.pop("entropy_coef"),
        "vf_coef": learn.pop("value_coef"),
        "normalize_advantage": learn.pop("adv_norm"),
        "max_grad_norm": learn.pop("grad_clip"),
        "learning_rate": _annealed(lr, anneal, budget),
        "clip_range": _annealed(clip, anneal, budget),
        "policy_kwargs": _net(cfg["policy"]["model"], "ppo"),
    }
    if "log_std_init" in cfg["policy"]["model"]:  # the Gaussian's (Box actions only)
        kwargs["policy_kwargs"]["log_std_init"] = _take(cfg, "policy.model.log_std_init")
    _require(
        _take(cfg, "policy.eval.deterministic"),
        True,
        "policy.eval.deterministic",
        "is evaluated greedily here, as our harness evaluates by default",
    )
    _done(cfg)
    return kwargs


def _annealed(value: float, horizon: Optional[int], budget: int) -> Any:
    """Ours: value * max(0, 1 - env_steps / horizon); SB3 passes the progress remaining,
    1 - env_steps / budget."""
    if not horizon:
        return value
    return lambda left: value * max(0.0, 1.0 - (1.0 - left) * budget / horizon)


def _normalize(section: Any, gamma: float) -> Optional[dict]:
    if not section:
        return None
    if section is True:
        section = {"obs": True, "reward": True}
    unknown = set(section) - set(NORMALIZE)
    if unknown:
        raise Unmappable(f"normalize.{sorted(unknown)[0]} has no VecNormalize mapping")
    kwargs = {"gamma": gamma, "norm_obs": False, "norm_reward": False}
    kwargs.update({NORMALIZE[k]: v for k, v in section.items() if v is not None})
    return kwargs if kwargs["norm_obs"] or kwargs["norm_reward"] else None


def evaluate(
    predict: Callable[[np.ndarray], Any],
    episodes: int,
    seed: int,
    env_id: str,
    env_kwargs: Optional[dict] = None,
    max_steps: Optional[int] = None,
) -> list:
    """`episodes` episodes, episode i reset with seed + i; `predict` maps an observation to
    an action (greedy)."""
    make_kwargs = dict(env_kwargs or {})
    if max_steps is not None:
        make_kwargs["max_episode_steps"] = max_steps
    env = gym.make(env_id, **make_kwargs)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            action = predict(obs)
            obs, reward, terminated, truncated, _ = env.step(int(action) if discrete else action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def run_sb3(config: RunConfig, seed: int, setup: Optional[Sb3Setup] = None) -> dict[str, Any]:
    """Train SB3 as `config` says with `seed`, under `config.training`'s eval protocol;
    returns {"bench", "seed", "evals", "wall_s", "first_success"}."""
    try:
        from stable_baselines3 import DQN, PPO
        from stable_baselines3.common.logger import Logger
    except ImportError as exc:
        raise SystemExit("bench needs stable-baselines3: pip install -e '.[bench]'") from exc

    torch.set_num_threads(1)  # as our services run; the machines have 2 cores
    setup = setup or sb3_setup(config)
    spec = _training(config)
    env, normalizer = _vec_env(setup, spec.max_steps, seed)
    cls = DQN if setup.algo == "dqn" else PPO
    # device="cpu": SB3 would pick CUDA when present, and its small MLPs run slower there
    model = cls("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **setup.kwargs)
    model.set_logger(Logger(None, []))  # SB3's own leaves an empty /tmp/SB3-<time> per run
    evaluations = _Evaluations(model, normalizer, setup, spec)
    model.learn(total_timesteps=setup.budget, callback=evaluations.callback())
    evaluations.at_the_end()
    wall = time.monotonic() - evaluations.started
    env.close()
    success = first_success(evaluations.evals, spec.stop_value)
    return {
        "bench": f"sb3_{setup.algo}",
        "seed": seed,
        "evals": evaluations.evals,
        "wall_s": round(wall, 3),
        "first_success": success
        and {k: success[k] for k in ("env_steps", "wall_s", "mean_return")},
    }


def _vec_env(
    setup: Sb3Setup, max_steps: Optional[int], seed: int
) -> tuple[VecEnv, Optional[VecNormalize]]:
    """SB3's vector env of the training copies, each capped at `max_steps` as ours are; under
    VecNormalize when the config normalizes (returned apart too: evaluations normalize
    their observations with its frozen statistics)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    wrapper_kwargs = {"max_episode_steps": max_steps} if max_steps else None
    env = make_vec_env(
        setup.env_id,
        n_envs=setup.n_envs,
        seed=seed,
        env_kwargs=setup.env_kwargs or None,
        # (SB3 types the wrapper as taking the env alone: it is also given wrapper_kwargs)
        wrapper_class=gym.wrappers.TimeLimit if wrapper_kwargs else None,  # type: ignore[arg-type]
        wrapper_kwargs=wrapper_kwargs,
    )
    if not setup.normalize:
        return env, None
    normalized = VecNormalize(env, **setup.normalize)
    return normalized, normalized


class _Evaluations:
    """`mistk-rl run`'s evaluation protocol on an SB3 model as it learns: greedy episodes on
    the evaluation seeds every `eval_every` env steps (from SB3's callback), the training
    stopped once a mean reaches stop_value; each evaluation recorded as `run` records it,
    its time counted from the first training step."""

    def __init__(
        self,
        model: BaseAlgorithm,
        normalizer: Optional[VecNormalize],
        setup: Sb3Setup,
        spec: TrainingSpec,
    ) -> None:
        self.model, self.normalizer, self.setup, self.spec = model, normalizer, setup, spec
        self.evals: list[dict] = []
        self.next_eval = spec.eval_every
        self.started = time.monotonic()

    def callback(self) -> Any:
        """SB3's callback: after every step of the vector env, `on_step`."""
        from stable_baselines3.common.callbacks import BaseCallback

        evaluations = self

        class EvalEvery(BaseCallback):
            def _on_step(self) -> bool:
                return evaluations.on_step(self.num_timesteps)

        return EvalEvery()

    def on_step(self, num_timesteps: int) -> bool:
        """Evaluate when one is due; False (stop training) once a mean reached stop_value."""
        if num_timesteps < self.next_eval:
            return True
        self.next_eval += self.spec.eval_every
        stop = self.spec.stop_value
        return self.record() < (np.inf if stop is None else stop)

    def at_the_end(self) -> None:
        """Evaluate once more at the end of the budget, as the harness does (unless the
        run stopped at stop_value, or its last evaluation was at the end)."""
        stop, evals = self.spec.stop_value, self.evals
        reached = stop is not None and evals and evals[-1]["mean_return"] >= stop
        if not reached and (not evals or evals[-1]["env_steps"] < self.setup.budget):
            self.record()

    def record(self) -> float:
        """One evaluation; its mean return."""
        spec, setup = self.spec, self.setup
        returns = evaluate(
            self.predict,
            spec.eval_episodes,
            spec.eval_seed,
            setup.env_id,
            setup.env_kwargs,
            spec.max_steps,
        )
        self.evals.append(
            {
                "env_steps": int(self.model.num_timesteps),
                "wall_s": round(time.monotonic() - self.started, 3),
                "mean_return": float(np.mean(returns)),
                "returns": returns,
            }
        )
        return self.evals[-1]["mean_return"]

    def predict(self, obs: np.ndarray) -> Any:
        """The greedy action (observations normalized with frozen statistics, as our
        agent's eval mode does)."""
        seen = obs if self.normalizer is None else self.normalizer.normalize_obs(obs)
        return self.model.predict(seen, deterministic=True)[0]
