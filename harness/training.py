"""Training runs: alternate training episodes and evaluation episodes through the orchestrator.

Training runs to exactly each eval point (`eval_every` env steps of training; the episodes
in progress then are continued afterwards, not cut), then `eval_episodes` episodes run with
``train: false`` (the agent acts in eval mode and does not learn) on fixed seeds, so
successive evaluations are comparable. They run on
`eval_envs` env copies at once (default: one copy per episode), one request per step for all.
Wall time is counted from the first training step. The learning curve goes to ``evals.csv``,
``learning_curve.png`` and TensorBoard (``tensorboard/``) in the run directory.
"""
from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Callable, Optional

from harness.config import TrainingSpec
from mistk_rl.client import OrchestratorClient
from mistk_rl.rl.evaluator import summarize
from mistk_rl.schemas import EpisodeConfig, EpisodeResult

Say = Callable[[str], None]


def train(orch: OrchestratorClient, spec: TrainingSpec, run_dir: Path, timeout: float,
          say: Say) -> list[dict]:
    """Run the training loop; returns the evaluations (also written to disk)."""
    writer = _tensorboard(run_dir / "tensorboard")
    evals: list[dict] = []
    train_steps = train_episodes = 0
    started = time.monotonic()
    try:
        while train_steps < spec.env_steps:
            budget = min(spec.eval_every - train_steps % spec.eval_every,
                         spec.env_steps - train_steps)
            # resume: the block stops at exactly `budget` env steps and the next one continues
            # its episodes, so evaluating never cuts or restarts a training episode
            steps_before = orch.status().payload.get("envSteps", 0)
            episodes = _run(orch, EpisodeConfig(
                num_steps=budget, seed=spec.seed, max_steps=spec.max_steps, train=True,
                num_envs=spec.num_envs, env_manager=spec.env_manager, resume=True), timeout)
            train_steps += orch.status().payload.get("envSteps", 0) - steps_before
            train_episodes += len(episodes)
            for e in episodes:
                writer.add_scalar("train/episode_return", e.return_, train_steps)
            result = summarize([e.return_ for e in _run(orch, EpisodeConfig(
                num_episodes=spec.eval_episodes, seed=spec.eval_seed, max_steps=spec.max_steps,
                train=False, num_envs=spec.eval_envs or spec.eval_episodes,
                env_manager=spec.env_manager), timeout)
                if not e.abnormal], spec.stop_value)
            record = {"env_steps": train_steps, "wall_s": round(time.monotonic() - started, 3),
                      "mean_return": result.mean_return, "std_return": result.std_return,
                      "returns": result.returns, "train_episodes": train_episodes}
            evals.append(record)
            writer.add_scalar("eval/mean_return", result.mean_return, train_steps)
            writer.add_scalar("eval/wall_s", record["wall_s"], train_steps)
            writer.flush()
            say(f"  eval at {train_steps:7d} env steps ({record['wall_s']:7.1f} s): "
                f"mean return {result.mean_return:7.2f} ± {result.std_return:.2f} "
                f"over {len(result.returns)} episodes")
            if result.stop:
                say(f"  reached stop_value {spec.stop_value}: stopping")
                break
    finally:
        writer.close()
        write_curve(evals, run_dir)
    return evals


def _run(orch: OrchestratorClient, config: EpisodeConfig, timeout: float) -> list[EpisodeResult]:
    """One startEpisode to completion; returns the episodes it played."""
    before = len(orch.get_results().episodes)
    orch.start_episode(config, wait=True, timeout=timeout)
    orch.stop_episode()
    return orch.get_results().episodes[before:]


def write_curve(evals: list[dict], run_dir: Path) -> None:
    """``evals.csv`` and ``learning_curve.png`` (mean ± std eval return vs env steps)."""
    with open(run_dir / "evals.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["env_steps", "wall_s", "mean_return", "std_return"])
        for e in evals:
            out.writerow([e["env_steps"], e["wall_s"], e["mean_return"], e["std_return"]])
    if not evals:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [e["env_steps"] for e in evals]
    mean = [e["mean_return"] for e in evals]
    std = [e["std_return"] for e in evals]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, mean, marker="o")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)],
                    [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval mean return")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "learning_curve.png", dpi=100)
    plt.close(fig)


class _NullWriter:
    def add_scalar(self, *args: object) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def _tensorboard(log_dir: Path) -> "object":
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: the CSV and PNG still get written
        return _NullWriter()
    return SummaryWriter(log_dir=str(log_dir))


def first_success(evals: list[dict], stop_value: Optional[float]) -> Optional[dict]:
    """The first evaluation whose mean reached `stop_value`."""
    if stop_value is None:
        return None
    return next((e for e in evals if e["mean_return"] >= stop_value), None)
