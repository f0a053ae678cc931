"""`mistk-rl bench thinker-planner` and `thinker-model`: the Thinker MDP's own figures.

- thinker-planner: the scripted planner (random imagination, then the root child with the best
  return found) on the puzzle with the perfect model and an untrained (zero) value function,
  in-process: the share of episodes solved, over random levels of the pool, per (K, L).
- thinker-model: the learned model (wrapper_type 0) trained inside `step` over a run of real
  steps driven by a behaviour policy (`Behaviour`): its losses over time, whether its outputs
  stay finite, the time per augmented step, and what its tree is worth to a planner
  (`thinker_agent.model_figures`).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import numpy as np

from harness.bench.thinker_agent import model_figures, say_model_figures
from mistk_rl.thinker import make
from mistk_rl.thinker.env import ThinkerEnv
from mistk_rl.thinker.planner import plan
from mistk_rl.thinker.puzzle import ENV_ID, solver_action


def planner_solve_rate(
    rec_t: int = 10, max_depth: int = 5, episodes: int = 3000, env_n: int = 16, seed: int = 0
) -> dict[str, Any]:
    """Play the scripted planner until `episodes` episodes ended; a solved episode is one
    whose return includes the +10 for the box on the target."""
    env = make(
        ENV_ID,
        env_n=env_n,
        wrapper_type=2,
        rec_t=rec_t,
        max_depth=max_depth,
        train_model=False,
        model_zero_init=True,
        seed=seed,
    )
    rng = np.random.default_rng(seed)
    state = env.reset()
    solved = ended = steps = 0
    start = time.perf_counter()
    try:
        while ended < episodes:
            primary, reset = plan(state["tree_reps"], env.num_actions, rng)
            state, _, done, info = env.step(primary, reset)
            steps += env_n
            for i in np.flatnonzero(done):
                ended += 1
                solved += bool(info["episode_return"][i] > 5.0)
    finally:
        env.close()
    wall = time.perf_counter() - start
    return {
        "rec_t": rec_t,
        "max_depth": max_depth,
        "seed": seed,
        "episodes": ended,
        "solved": solved,
        "solve_rate": solved / ended,
        "augmented_steps": steps,
        "augmented_steps_per_s": steps / wall,
        "wall_s": wall,
    }


def bench_planner(
    settings: Sequence[tuple[int, int]] = ((10, 5), (20, 5)), episodes: int = 3000, seed: int = 0
) -> list[dict[str, Any]]:
    rows = []
    for rec_t, max_depth in settings:
        row = planner_solve_rate(rec_t, max_depth, episodes, seed=seed)
        print(
            f"K={rec_t:>3} L={max_depth}: solved {row['solved']}/{row['episodes']} "
            f"= {row['solve_rate']:.3f} (seed {seed}; {row['augmented_steps_per_s']:.0f} "
            f"augmented steps/s)",
            flush=True,
        )
        rows.append(row)
    return rows


MODEL_SETTINGS = dict(
    wrapper_type=0,
    rec_t=10,
    max_depth=5,
    model_warm_up_n=2000,
    model_buffer_n=20000,
    model_lr=2e-3,
    total_steps=20000,
    model_batch_size=64,
    model_min_replay_ratio=36.0,
    model_max_replay_ratio=40.0,
)
"""The learned-model run: v1.1's defaults are for 50M real steps (warm-up 200k, lr 1e-4,
replay ratio 5, batch 128); a 20k-step run on CPU warms up on 2k, keeps all 20k, decays a
larger rate to 0 over them and makes ~2,250 updates of 64 windows (trained up to replay ratio
40, as v1.1's single process trains up to its maximum). At ratio
5 (141 updates) the reward loss only reaches the plateau of predicting the mean reward: a net
of this size takes ~500 updates to find the push that solves a level even one step ahead."""


class Behaviour:
    """How the real puzzle copies are driven while the model learns (the imaginary steps stay
    uniform random). "random": uniform moves; under them a level is solved about once in 600
    steps, so a 20k-step run sees ~30 of the +11 rewards and its held-out windows a handful,
    too few for a reward loss to learn or to measure. "solver": the next move of a shortest
    solution from the env's true state, a uniform move with probability `epsilon` or when
    none is left (the box stuck): levels get solved, and missed, in varied ways."""

    def __init__(self, kind: str = "random", epsilon: float = 0.3, seed: int = 0) -> None:
        if kind not in ("random", "solver"):
            raise ValueError(f"behaviour {kind!r}: use 'random' or 'solver'")
        self.kind, self.epsilon = kind, epsilon
        self.rng = np.random.default_rng(seed)

    def __call__(self, envs: Sequence[Any]) -> np.ndarray:
        """One move per env copy (gymnasium envs over the puzzle)."""
        moves = self.rng.integers(4, size=len(envs))
        if self.kind == "solver":
            for i, env in enumerate(envs):
                if self.rng.random() >= self.epsilon:
                    best = solver_action(env.unwrapped.clone_state())
                    moves[i] = moves[i] if best is None else best
        return moves

    def describe(self) -> str:
        return (
            "uniform random"
            if self.kind == "random"
            else (f"shortest-solution solver, epsilon {self.epsilon}")
        )


def held_out_windows(
    k: int,
    env_n: int = 16,
    steps: int = 200,
    seed: int = 1,
    batch: int = 512,
    behaviour: str = "random",
    epsilon: float = 0.3,
):
    """Windows of real puzzle transitions under the run's behaviour policy, from env copies
    and seeds the run never sees: a fixed set to measure the model of the world on."""
    import gymnasium as gym

    from mistk_rl.thinker.model_learner import ModelReplay

    envs = [gym.make(ENV_ID) for _ in range(env_n)]
    frames = np.stack([env.reset(seed=seed * 1000 + i)[0] for i, env in enumerate(envs)])
    replay = ModelReplay(env_n, steps, 2 * k + 1, frames.shape[1:], frames.dtype, 4, False, 0.6)
    rng = np.random.default_rng(seed)
    act = Behaviour(behaviour, epsilon, seed)
    prev = np.zeros(env_n, dtype=np.int64)
    for _ in range(steps):
        actions = act(envs)
        out = [env.step(int(a)) for env, a in zip(envs, actions)]
        rewards = np.array([o[1] for o in out], dtype=np.float32)
        terminated = np.array([o[2] for o in out])
        truncated = np.array([o[3] for o in out])
        done = terminated | truncated
        replay.add(
            frames=frames,
            prev_actions=prev,
            actions=actions,
            rewards=rewards,
            dones=done,
            truncated=truncated & ~terminated,
            baselines=np.zeros(env_n, np.float32),
            probs=None,
        )
        frames = np.stack([env.reset()[0] if d else o[0] for env, o, d in zip(envs, out, done)])
        prev = np.where(done, 0, actions)
    return replay.sample(batch, 1.0, rng, k)  # priorities all equal: uniform


def held_out_rewards(held: Any, k: int) -> str:
    """How many of the held-out windows' unrolled steps carry a solving reward."""
    from mistk_rl.thinker.model_learner import alive_mask

    alive = alive_mask(held.dones, k)[:, :k].astype(bool)
    solved = int((held.rewards[:, :k][alive] > 5.0).sum())
    return f"{solved} of {int(alive.sum())} unrolled steps solve a level"


def world_losses(learner: Any, held: Any, k: int) -> dict[str, float]:
    """The state-reward net's losses (reward, done, next frame) on the held-out windows."""
    import torch

    from mistk_rl.thinker.model_learner import alive_mask

    with torch.no_grad():
        alive = torch.from_numpy(alive_mask(held.dones, k)).float()
        losses, _ = learner.sr_losses(held, learner.model.scale(held.frames), alive)
    return {name: float(value.mean()) for name, value in losses.items()}


def bench_model(
    real_steps: int = 20000,
    env_n: int = 16,
    seed: int = 0,
    out: str = "runs/bench-thinker-model",
    settings: Optional[dict[str, Any]] = None,
    behaviour: str = "solver",
    epsilon: float = 0.3,
    measure_every: int = 100,
    tree_levels: int = 500,
) -> dict[str, Any]:
    """The learned model on the puzzle, trained inside `step` while `Behaviour` drives the
    real steps (imaginary moves and resets uniform random): its world losses on fixed held-out
    windows of the same behaviour as training goes (the training batches' own losses are
    prioritized samples: noisy, and biased towards the rare big rewards), whether every output
    stays finite, and the time per augmented step with and without the model's updates.
    `settings` override MODEL_SETTINGS; the losses are measured every `measure_every`
    updates; the planner on the final model's tree plays `tree_levels` levels."""
    import json
    from pathlib import Path

    settings = {**MODEL_SETTINGS, **(settings or {})}
    env = make(ENV_ID, env_n=env_n, seed=seed, **settings)
    k = env.cfg.model_unroll_len
    held = held_out_windows(k, seed=seed + 1, behaviour=behaviour, epsilon=epsilon)
    rng = np.random.default_rng(seed)
    act = Behaviour(behaviour, epsilon, seed)
    env.reset(seed=seed)
    run = _ModelRun(env, held, k, measure_every)
    try:
        while run.real < real_steps:
            run.step(act, rng)
    finally:
        env.close()
    wall = run.finish()
    figures = run.figures({**settings, "env_n": env_n, "seed": seed}, act.describe(), wall)
    figures["tree"] = model_figures(
        env.model, seed, levels=tree_levels, accuracy_levels=min(400, tree_levels)
    )
    _say_model_figures(figures, measure_every)
    print(f"its tree: {say_model_figures(figures['tree'])}", flush=True)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.json").write_text(json.dumps(figures, indent=2))
    return figures


class _ModelRun:
    """`bench_model`'s run, one augmented step at a time: the real moves the behaviour's,
    the imaginary ones and the resets uniform random; the time inside `step` counted apart
    (the MDP and its model's training, not the behaviour), and the world losses measured
    every `measure_every` updates of the model."""

    def __init__(self, env: ThinkerEnv, held: Any, k: int, measure_every: int) -> None:
        assert env.model is not None  # (wrapper_type 0: the MDP has a learned model)
        self.env, self.held, self.k, self.measure_every = env, held, k, measure_every
        self.learner = env.model.learner
        self.curve: list[dict[str, Any]] = [
            {
                "real_steps": 0,
                "updates": 0,
                "wall_s": 0.0,
                "held_out": world_losses(self.learner, held, k),
            }
        ]
        self.finite = True
        self.augmented = self.real = 0
        self.step_s = 0.0
        self.start = time.perf_counter()

    def step(self, act: Behaviour, rng: np.random.Generator) -> None:
        """One augmented step of every copy; a real one may add a point to the curve."""
        env, env_n = self.env, self.env.env_n
        primary = act(env.envs) if env.next_step_real else rng.integers(env.num_actions, size=env_n)
        resets = rng.integers(2, size=env_n)
        began = time.perf_counter()
        state, reward, _, info = env.step(primary, resets)
        self.step_s += time.perf_counter() - began
        self.augmented += env_n
        self.finite &= bool(np.isfinite(reward).all()) and all(
            bool(np.isfinite(v).all()) for v in state.values()
        )
        if info["step_status"][0] == 0:
            self.real += env_n
            if self.learner.updates >= self.curve[-1]["updates"] + self.measure_every:
                self.curve.append(self.point(time.perf_counter() - self.start))

    def point(self, wall_s: float) -> dict[str, Any]:
        """Where the model stands: its world losses on the held-out windows, and its last
        training batch's."""
        return {
            "real_steps": self.real,
            "updates": self.learner.updates,
            "wall_s": wall_s,
            "held_out": world_losses(self.learner, self.held, self.k),
            "batch": dict(self.learner.losses),
        }

    def finish(self) -> float:
        """The curve's last point, and whether every held-out loss stayed finite; the
        run's wall time."""
        wall = time.perf_counter() - self.start
        self.curve.append(self.point(wall))
        self.finite &= all(np.isfinite(v) for row in self.curve for v in row["held_out"].values())
        return wall

    def figures(self, settings: dict[str, Any], behaviour: str, wall: float) -> dict[str, Any]:
        """model.json: the run's settings, counts and times, and its curve of losses."""
        learner, augmented = self.learner, self.augmented
        return {
            "settings": settings,
            "behaviour": behaviour,
            "held_out_rewards": held_out_rewards(self.held, self.k),
            "real_steps": self.real,
            "augmented_steps": augmented,
            "updates": learner.updates,
            "replay_ratio": learner.replay_ratio,
            "outputs_finite": self.finite,
            "wall_s": wall,
            "step_s": self.step_s,
            "update_s": learner.update_s,
            "us_per_augmented_step": 1e6 * self.step_s / augmented,
            "us_per_augmented_step_untrained": 1e6 * (self.step_s - learner.update_s) / augmented,
            "losses": self.curve,
        }


def _say_model_figures(figures: dict[str, Any], measure_every: int) -> None:
    """Each held-out loss over the run, then what the run did and what its steps cost."""
    curve = figures["losses"]
    for name in curve[0]["held_out"]:
        print(
            f"held-out {name:>4} loss: "
            + " ".join(f"{row['held_out'][name]:.4f}" for row in curve)
            + f" (every {measure_every} updates)"
        )
    print(f"behaviour: {figures['behaviour']}; held-out windows: {figures['held_out_rewards']}")
    print(
        f"{figures['real_steps']} real steps ({figures['augmented_steps']} augmented, "
        f"{figures['settings']['env_n']} envs), {figures['updates']} updates "
        f"(replay ratio {figures['replay_ratio']:.2f}), outputs finite: "
        f"{figures['outputs_finite']}; {figures['wall_s']:.0f} s in all, "
        f"{figures['step_s']:.0f} s in step = {figures['us_per_augmented_step']:.0f} us per "
        f"augmented step, {figures['us_per_augmented_step_untrained']:.0f} us without the "
        f"{figures['update_s']:.0f} s of model updates",
        flush=True,
    )


PPO_CONFIGS = {"raw": "configs/puzzle_raw_ppo.yaml", "thinker": "configs/puzzle_thinker_ppo.yaml"}
SOLVED_RETURN = 5.0  # a solved episode's return holds the +10; an unsolved one is at most 1


def solve_rates(results: dict[str, Any]) -> list[tuple[int, float]]:
    """(real env steps, share of evaluation episodes solved) of each evaluation of a run."""
    return [
        (e["env_steps"], float(np.mean(np.asarray(e["returns"]) > SOLVED_RETURN)))
        for e in results["evals"]
    ]


def bench_ppo(
    seeds: Sequence[int] = (0, 1, 2),
    out: str = "runs/bench-thinker-ppo",
    arms: Sequence[str] = ("raw", "thinker"),
) -> dict[str, Any]:
    """Run each arm's config once per seed (`mistk-rl run --seed S`), then put the solve-rate
    curves of all runs in one plot, with each arm's mean at the last evaluation."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(out)
    curves: dict[str, dict[int, list[tuple[int, float]]]] = {arm: {} for arm in arms}
    for arm in arms:
        for seed in seeds:
            run_dir = root / f"{arm}-s{seed}"
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "harness",
                    "run",
                    PPO_CONFIGS[arm],
                    "--seed",
                    str(seed),
                    "--out",
                    str(run_dir),
                    "--quiet",
                ],
                check=True,
            )
            results = json.loads((run_dir / "results.json").read_text())
            curves[arm][seed] = solve_rates(results)
            steps, rate = curves[arm][seed][-1]
            print(
                f"{arm:>8} seed {seed}: solve rate {rate:.3f} at {steps} real steps "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    summary = {
        arm: {
            "final": float(np.mean([c[-1][1] for c in runs.values()])),
            "per_seed": {s: c[-1][1] for s, c in runs.items()},
        }
        for arm, runs in curves.items()
    }
    for arm, row in summary.items():
        print(
            f"{arm:>8}: mean solve rate {row['final']:.3f} at the last evaluation "
            f"(seeds {', '.join(map(str, seeds))})"
        )
    figures = {"seeds": list(seeds), "curves": curves, "summary": summary}
    (root / "solve_rates.json").write_text(json.dumps(figures, indent=2))
    _plot(curves, root / "solve_rates.png")
    return figures


def _plot(curves: dict[str, dict[int, list[tuple[int, float]]]], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for colour, (arm, runs) in zip(("tab:blue", "tab:orange"), curves.items()):
        for curve in runs.values():
            steps, rates = zip(*curve)
            ax.plot(steps, rates, color=colour, alpha=0.35, linewidth=1)
        at = [s for s, _ in next(iter(runs.values()))]
        mean = np.mean([[r for _, r in c] for c in runs.values()], axis=0)
        ax.plot(at, mean, color=colour, linewidth=2.5, label=f"{arm} (mean of {len(runs)})")
    ax.set_xlabel("real env steps")
    ax.set_ylabel("share of evaluation episodes solved")
    ax.set_title("PPO on the puzzle: raw MDP vs Thinker MDP (perfect model, K=10, L=5)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
