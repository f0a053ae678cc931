"""`mistk-rl bench thinker-agent`: does an agent on the Thinker MDP learn to plan?

Arms, the same PPO and the same real-step budget a seed:
- **thinker**: `ThinkerPPOPolicy` (the tree-reading actor-critic) on the Thinker puzzle with
  the perfect model (wrapper_type 2, K=10, L=5, v = 0), every augmented step a transition;
- **raw**: `PPOPolicy` on the raw puzzle;
- **thinker-learned**: the thinker arm on the learned model (wrapper_type 0), trained inside
  `step` from the agent's own real steps; its row also says what the model's tree is worth
  apart from the agent (`model_figures`: reward recall and false alarms along real paths,
  the scripted planner on its tree);
- **thinker-vp**: the thinker arm with the perfect model's value-policy net trained inside
  `step` as the learned arm's is (the paper's perfect-model agent: the tree's values and
  policies are learnt, its dynamics are the env's); its row also gives the scripted planner
  on that tree;
- **planner**: the scripted planner (`mistk_rl.thinker.planner`), which learns nothing,
  evaluated on the same levels.

Training runs in-process: the policy, `Learner` and `OnPolicyTrainer` classes the agent
services use, driven by a batched `ThinkerEnv` that steps its copies in lock step (two seeds
at a time on 2 cores: 637-783 s a Thinker seed at 200k real steps; the agent served over
HTTP, configs/puzzle_thinker_agent.yaml, took 952-1,063 s). Episodes restart inside the step
(`auto_reset`); an episode the 50-step cap ends bootstraps from its final state
(`info["final_state"]`), in every arm, as the served path does.

Evaluation plays the whole level pool once (1,500 levels, each copy its own share in order),
sampling the policy (as `bench thinker-ppo`: a greedy policy that has not learnt a level walks
into a wall until the cap); an episode is solved when its return holds the +10. The summary
is each arm's per-seed solve rates, their mean and range, and each learning Thinker arm's
difference from raw with a 95% interval (Welch's t over seeds), and from the planner where
it was run.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from gymnasium import spaces

from harness.bench.model_tree import reward_accuracy, say_reward_accuracy
from harness.stats import welch_interval
from mistk_rl.rl.learner import Learner
from mistk_rl.rl.policies.ppo import PPOPolicy
from mistk_rl.rl.trainers import OnPolicyTrainer
from mistk_rl.thinker import puzzle
from mistk_rl.thinker.config import load_config
from mistk_rl.thinker.env import ThinkerEnv
from mistk_rl.thinker.planner import plan
from mistk_rl.thinker.policy import ThinkerPPOPolicy

THINKER: dict[str, Any] = {"wrapper_type": 2, "rec_t": 10, "max_depth": 5, "train_model": False}
K = THINKER["rec_t"]
# the learned model (wrapper_type 0) trained inside `step` from the agent's own real steps:
# `bench thinker-model`'s settings (warm-up 2k, lr 2e-3 decayed to 0 over the run, batch 64),
# its replay ratio 10 (v1.1's 5-6 left the reward loss at the mean-reward plateau there), the
# whole run kept in the replay, and priorities that add the reward error to v1.1's value error
# (with the value error alone, seed 1 of 3 never learned the solving reward: recall .004)
LEARNED: dict[str, Any] = {
    **THINKER,
    "wrapper_type": 0,
    "train_model": True,
    "return_h": False,
    "model_warm_up_n": 2000,
    "model_lr": 2e-3,
    "model_batch_size": 64,
    "model_min_replay_ratio": 8.0,
    "model_max_replay_ratio": 10.0,
    "model_reward_priority": 1.0,
}
# the perfect model (wrapper_type 2) with its value-policy net trained as the learned arm's
PERFECT_VP: dict[str, Any] = {
    **THINKER,
    **{key: value for key, value in LEARNED.items() if key.startswith("model_")},
    "train_model": True,
}
BASES = {"raw": {"wrapper_type": 1}, "thinker": THINKER, "thinker-learned": LEARNED}
BASES["thinker-vp"] = PERFECT_VP
TRAINS_MODEL = ("thinker-learned", "thinker-vp")
ARMS = ("raw", "thinker", "thinker-learned", "thinker-vp", "planner")

# PPO as configs/puzzle_raw_ppo.yaml; the thinker arm discounts each of a stage's K steps by
# gamma ** (1/K) (the paper's actor), so both arms discount a real step alike
RAW_PPO: dict[str, dict[str, Any]] = {
    "model": {"hidden_sizes": [128, 128], "activation": "tanh"},
    "learn": {
        "lr": 3e-4,
        "epochs": 4,
        "batch_size": 256,
        "clip": 0.2,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "entropy_coef": 0.01,
        "value_coef": 0.5,
        "grad_clip": 0.5,
    },
    "eval": {"deterministic": False},
}
THINKER_PPO: dict[str, dict[str, Any]] = {
    "model": {"hidden_sizes": [128, 128], "activation": "tanh"},
    "learn": {
        "lr": 3e-4,
        "epochs": 4,
        "batch_size": 512,
        "clip": 0.2,
        "gamma": 0.99 ** (1 / K),
        "gae_lambda": 0.95 ** (1 / K),
        "entropy_coef": 0.01,
        "value_coef": 0.5,
        "grad_clip": 0.5,
    },
    "eval": {"deterministic": False},
}
OBS_KEYS = ("tree_reps", "real_states", "xs")
ROLLOUT = {"raw": 2048, "thinker": 4096, "thinker-learned": 4096, "thinker-vp": 4096}


def _env(arm: str, env_fns: list, seed: Optional[int], mdp: Optional[dict] = None) -> ThinkerEnv:
    return ThinkerEnv(env_fns, load_config({**BASES[arm], **(mdp or {})}, seed=seed))


def _policy(arm: str, env: ThinkerEnv, seed: int, overrides: Optional[dict] = None):
    a = env.num_actions
    cls: type[PPOPolicy]
    if arm != "raw":
        config = copy.deepcopy(THINKER_PPO)
        cls, action_space = ThinkerPPOPolicy, spaces.Discrete(2 * a)
    else:
        config = copy.deepcopy(RAW_PPO)
        cls, action_space = PPOPolicy, spaces.Discrete(a)
    for section, values in (overrides or {}).items():
        config.setdefault(section, {}).update(values)
    return cls(config, env.observation_space, action_space, seed=seed)


def _act(
    policy: Any, state: dict[str, np.ndarray], mode: str, env_steps: int
) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    obs = {k: torch.as_tensor(v) for k, v in state.items() if k in OBS_KEYS}
    out = (
        policy.collect_mode.forward(obs, None, env_steps)
        if mode == "collect"
        else policy.eval_mode.forward(obs, None)
    )
    return out["action"].numpy(), out


def _split(arm: str, actions: np.ndarray, a: int) -> tuple[np.ndarray, np.ndarray]:
    if arm != "raw":
        return actions % a, actions // a
    return actions, np.zeros_like(actions)


def train(
    arm: str,
    seed: int,
    real_steps: int,
    env_n: int = 16,
    overrides: Optional[dict] = None,
    mdp: Optional[dict] = None,
    log: Any = print,
) -> tuple[Any, dict[str, Any], Any]:
    """Train one arm for `real_steps` real env steps over `env_n` copies; (policy, stats,
    the MDP's learned model or None)."""
    torch.set_num_threads(1)
    if arm in TRAINS_MODEL:  # (the model's schedules end with the run)
        mdp = {"total_steps": real_steps, "model_buffer_n": real_steps, **(mdp or {})}
    env = _env(arm, [lambda: puzzle.PuzzleEnv()] * env_n, seed, mdp)
    policy = _policy(arm, env, seed, overrides)
    learner = Learner(policy.learn_mode)
    trainer = OnPolicyTrainer(
        policy,
        learner,
        {
            "n_steps": ROLLOUT[arm],
            "updates_per_request": 10**9,
            "max_update_seconds_per_request": None,
        },
    )
    process = policy.collect_mode.process_transition
    state = env.reset()
    start = time.perf_counter()
    solving = _SolveRateLog(f"{arm} seed {seed}", env_n, start, log)
    while env.real_steps * env_n < real_steps:
        actions, out = _act(policy, state, "collect", learner.env_steps)
        primary, reset = _split(arm, actions, env.num_actions)
        real = env.next_step_real
        next_state, reward, done, info = env.step(primary, reset)
        learner.env_steps += env_n
        trainer.observe_all(_transitions(process, state, out, next_state, reward, done, info))
        trainer.maybe_train()
        if real:
            solving.count(done, info, env.real_steps)
        state = next_state
    env.close()
    stats: dict[str, Any] = {"train_s": time.perf_counter() - start, "updates": learner.train_iter}
    if env.model is not None:
        stats.update(
            model_updates=env.model.learner.updates,
            model_losses={k: round(float(v), 4) for k, v in env.model.losses.items()},
        )
    return policy, stats, env.model


def _transitions(
    process: Callable[..., dict],
    state: dict[str, np.ndarray],
    out: dict[str, torch.Tensor],
    next_state: dict[str, np.ndarray],
    reward: np.ndarray,
    done: np.ndarray,
    info: dict[str, Any],
) -> dict[str, dict]:
    """Each env copy's transition of one augmented step, by copy. An episode the step cap
    ended (truncated) bootstraps from its final state (`info["final_state"]`), as the
    served path does, not from the next episode's first."""
    truncated, finals = info["truncated_done"], info.get("final_state", {})
    batch = {}
    for i in range(len(reward)):
        row = {k: v[i] for k, v in out.items()}
        obs = {k: state[k][i] for k in OBS_KEYS if k in state}
        after = finals[i] if i in finals else {k: v[i] for k, v in next_state.items()}
        next_obs = {k: v for k, v in after.items() if k in OBS_KEYS}
        batch[str(i)] = process(
            obs,
            row,
            float(reward[i]),
            next_obs,
            bool(done[i] and not truncated[i]),
            bool(truncated[i]),
        )
    return batch


class _SolveRateLog:
    """The training episodes' solve rate, logged every 10k real steps and counted afresh
    after: whether the policy learns while it trains."""

    def __init__(self, name: str, env_n: int, start: float, log: Any) -> None:
        self.name, self.env_n, self.start, self.log = name, env_n, start, log
        self.solved = self.ended = 0

    def count(self, done: np.ndarray, info: dict[str, Any], real_steps: int) -> None:
        """A real step's ended episodes (`real_steps`: the real steps of each copy so far)."""
        for i in np.flatnonzero(done):
            self.ended += 1
            self.solved += bool(info["episode_return"][i] > 5.0)
        if real_steps % (10_000 // self.env_n) == 0 and self.log:
            self.log(
                f"  {self.name}: {real_steps * self.env_n:>7} real steps, "
                f"training solve rate {self.solved / max(self.ended, 1):.3f} over "
                f"{self.ended} episodes, {time.perf_counter() - self.start:.0f} s"
            )
            self.solved = self.ended = 0


def evaluate(
    arm: str,
    policy: Any,
    env_n: int = 50,
    pool_size: int = puzzle.POOL_SIZE,
    seed: int = 0,
    mdp: Optional[dict] = None,
    model: Any = None,
) -> dict[str, Any]:
    """Play each level of the pool once (copy j plays levels j, j + env_n, ...), sampling
    the policy; the share solved. `policy`: a trained one, or a function of the MDP's state
    to (primary, reset) actions (the scripted planner). `model`: the learned model the policy
    trained with (its weights, no longer trained)."""
    levels = puzzle.level_pool(0, pool_size)
    env_n = min(env_n, pool_size)  # (every copy plays at least one level)
    shares = [levels[j::env_n] for j in range(env_n)]
    fns = [lambda share=share: puzzle.PuzzleEnv(levels=share, in_order=True) for share in shares]
    if model is not None:
        mdp = {**(mdp or {}), "train_model": False, "model_zero_init": False}
    env = _env(arm, fns, seed, mdp)
    if model is not None:
        assert env.model is not None  # (an MDP whose model was trained: wrapper_type 0 or 2)
        for net, trained in ((env.model.sr, model.sr), (env.model.vp, model.vp)):
            if net is not None:  # (where vp_fn stands in for the VP-net, nothing to load)
                assert trained is not None  # (the model has every net this MDP builds)
                net.load_state_dict(trained.state_dict())
    wanted = np.array([len(share) for share in shares])
    played = np.zeros(env_n, dtype=np.int64)
    solved = 0
    state = env.reset()
    start = time.perf_counter()
    with torch.no_grad():
        while (played < wanted).any():
            if callable(policy):
                primary, reset = policy(state)
            else:
                primary, reset = _split(arm, _act(policy, state, "eval", 0)[0], env.num_actions)
            state, _, done, info = env.step(primary, reset)
            for i in np.flatnonzero(done):
                if played[i] < wanted[i]:
                    played[i] += 1
                    solved += bool(info["episode_return"][i] > 5.0)
    env.close()
    return {
        "episodes": int(played.sum()),
        "solved": solved,
        "solve_rate": solved / int(played.sum()),
        "eval_s": time.perf_counter() - start,
    }


def model_figures(
    model: Any,
    seed: int,
    arm: str = "thinker-learned",
    levels: int = 500,
    accuracy_levels: int = 400,
) -> dict[str, Any]:
    """What a trained model's tree is worth apart from any agent: a learned model's reward
    predictions along real paths (`model_tree.reward_accuracy`, the pool's first
    `accuracy_levels`; the perfect model has no predicted rewards) and the scripted planner's
    solve rate on its tree over the pool's first `levels`, with the VP-net's values and logits
    and with v = 0 and flat logits (the rewards alone, as the perfect model's planner reads
    them). The perfect model's planner solves ~.40; a random policy ~.145."""
    a = len(puzzle.ACTIONS)

    def flat(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(len(obs)), np.zeros((len(obs), a))

    def planner(rewards_only: bool) -> float:
        if rewards_only and model.sr is None:  # the perfect model with v = 0: the thinker arm
            row = evaluate("thinker", _planner(seed), pool_size=levels, seed=20_000 + seed)
        else:
            mdp = {"vp_fn": flat} if rewards_only else None
            row = evaluate(
                arm, _planner(seed), pool_size=levels, seed=20_000 + seed, mdp=mdp, model=model
            )
        return row["solve_rate"]

    figures: dict[str, Any] = {}
    if model.sr is not None:
        figures["model_reward"] = reward_accuracy(model, puzzle.level_pool(0, accuracy_levels))
    return {
        **figures,
        "planner_on_model": planner(rewards_only=False),
        "planner_on_model_rewards_only": planner(rewards_only=True),
        "planner_levels": levels,
    }


def say_model_figures(row: dict[str, Any]) -> str:
    reward = f"{say_reward_accuracy(row['model_reward'])}; " if "model_reward" in row else ""
    return (
        f"{reward}the scripted planner on its tree solves "
        f"{row['planner_on_model']:.3f}, on its rewards alone (v = 0) "
        f"{row['planner_on_model_rewards_only']:.3f} ({row['planner_levels']} levels)"
    )


def _planner(seed: int) -> Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """The scripted planner as `evaluate`'s policy: the MDP's state -> (primary, reset)."""
    rng = np.random.default_rng(seed)
    return lambda state: plan(state["tree_reps"], len(puzzle.ACTIONS), rng)


def bench_thinker_agent(
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    real_steps: int = 200_000,
    arms: Sequence[str] = ("raw", "thinker"),
    out: str = "runs/bench-thinker-agent",
) -> list[dict[str, Any]]:
    """Train and evaluate each arm at each seed; each result goes to its own file under
    `out` (`{arm}-seed{seed}-{real_steps}.json`, the trained weights beside it as `.pt`), so
    seeds run by separate invocations (one a core) are summarized together: the summary
    reads every result of this budget there."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for arm in arms:
            if arm == "planner":  # learns nothing: the tree's signal, on the same levels
                row = {
                    "arm": arm,
                    "seed": seed,
                    "real_steps": real_steps,
                    "train_s": 0.0,
                    **evaluate("thinker", _planner(seed), seed=10_000 + seed),
                }
            else:
                policy, stats, model = train(arm, seed, real_steps)
                row = {
                    "arm": arm,
                    "seed": seed,
                    "real_steps": real_steps,
                    **stats,
                    **evaluate(arm, policy, seed=10_000 + seed, model=model),
                }
                if model is not None:  # an arm that trains a model: what its tree is worth
                    row.update(model_figures(model, seed, arm))
                    print(f"{arm} seed {seed}, its model: {say_model_figures(row)}", flush=True)
                torch.save(policy.model.state_dict(), path / f"{arm}-seed{seed}-{real_steps}.pt")
            print(
                f"{arm:7s} seed {seed}: solved {row['solved']}/{row['episodes']} = "
                f"{row['solve_rate']:.3f} after {real_steps} real steps "
                f"({row['train_s']:.0f} s training, {row['eval_s']:.0f} s evaluating)",
                flush=True,
            )
            (path / f"{arm}-seed{seed}-{real_steps}.json").write_text(json.dumps(row))
    rows = [json.loads(f.read_text()) for f in sorted(path.glob(f"*-{real_steps}.json"))]
    summarize(rows, real_steps)
    return rows


def summarize(rows: Sequence[dict[str, Any]], real_steps: int) -> None:
    """Per arm, the seeds' solve rates, mean and range; each Thinker arm's difference from
    raw with its Welch interval."""
    rates: dict[str, dict[int, float]] = {}
    episodes: dict[str, set] = {}
    for row in rows:
        rates.setdefault(row["arm"], {})[row["seed"]] = row["solve_rate"]
        episodes.setdefault(row["arm"], set()).add(row["episodes"])
    for arm, by_seed in sorted(rates.items()):
        values = [by_seed[s] for s in sorted(by_seed)]
        print(
            f"{arm:7s} seeds {','.join(map(str, sorted(by_seed)))}: "
            f"{' '.join(f'{v:.3f}' for v in values)}; mean {np.mean(values):.3f} "
            f"(range {min(values):.3f}-{max(values):.3f}) at {real_steps} real steps, "
            f"{'/'.join(map(str, sorted(episodes[arm])))} evaluation episodes each"
        )
    for reference in ("raw", "planner"):
        others = list(rates.get(reference, {}).values())
        for arm in sorted(set(rates) - {"raw", "planner"}):
            values = list(rates[arm].values())
            if len(values) > 1 and len(others) > 1:
                diff, low, high = welch_interval(values, others)
                print(
                    f"{arm} - {reference}: {diff:+.3f}, 95% interval [{low:+.3f}, {high:+.3f}] "
                    f"(Welch's t over seeds)"
                )
