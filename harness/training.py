"""Training runs: alternate training episodes and evaluation episodes through the orchestrator.

Training runs to exactly each eval point (`eval_every` env steps of training; the episodes
in progress then are continued afterwards, not cut), then `eval_episodes` episodes run with
``train: false`` (the agent acts in eval mode and does not learn) on fixed seeds, so
successive evaluations are comparable. They run on
`eval_envs` env copies at once (default: one copy per episode), one request per step for all.
Wall time is counted from the first training step. The learning curve goes to ``evals.csv``,
``learning_curve.png`` and TensorBoard (``tensorboard/``) in the run directory.

Resuming: after each evaluation every agent saves a checkpoint (``checkpoints/step-<N>.pt`` in
its data dir; the last `checkpoints` are kept) and then ``progress.json`` records where the
run stands (`Progress`), both atomically: an evaluation is the one point where the agent's
state and the harness's schedule agree. `train(..., progress=...)` continues from there. What
cannot be restored is the training envs' episodes in progress (an orchestrator cannot save a
live env): a resumed run starts new ones, seeded from the run's seed and the number of
evaluations done, so resuming the same run dir twice plays the same episodes.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional, Protocol, Sequence, TypeVar

import numpy as np

from harness.config import RunConfigError, TrainingSpec
from harness.episodes import EPISODES, EpisodesFile
from harness.loop import Evaluated, run_loop
from harness.progress import TrainingProgress
from mistk_rl.files import atomic_write_bytes, atomic_write_json
from mistk_rl.sdk.client import AgentClient, OrchestratorClient
from mistk_rl.sdk.schemas import AgentSettings, EpisodeConfig, EpisodeResult


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


ROLLING = 20  # training episodes averaged in the learning curve
PROGRESS = "progress.json"


_Saved = TypeVar("_Saved", bound="ProgressFile")


class ProgressFile:
    """``progress.json`` in the run dir, for a dataclass of JSON-able fields."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # (the subclass is a dataclass)

    def save(self, run_dir: Path) -> None:
        atomic_write_json(run_dir / PROGRESS, asdict(self))

    @classmethod
    def load(cls: type[_Saved], run_dir: Path) -> _Saved:
        path = run_dir / PROGRESS
        if not path.exists():
            raise RunConfigError(
                f"{run_dir} has no {PROGRESS}: the run saved no checkpoint "
                "(it stopped before its first evaluation, or checkpoints are off)"
            )
        data = json.loads(path.read_text())
        legacy = data.pop("episodes", None)  # (before episodes.jsonl grew as the run went)
        if legacy and "episodes_saved" in cls.__dataclass_fields__:
            text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in legacy)
            atomic_write_bytes(run_dir / EPISODES, text.encode())
            data["episodes_saved"] = len(legacy)
        return cls(**data)


@dataclass
class Progress(ProgressFile):
    """A training run after its last evaluation: what ``mistk-rl run --resume`` continues."""

    train_steps: int = 0
    train_episodes: int = 0
    wall_s: float = 0.0  # training wall time so far (the time lost to a crash not counted)
    evals: list[dict] = field(default_factory=list)
    episodes_saved: int = 0  # the lines of episodes.jsonl this checkpoint counts
    checkpoints: dict[str, str] = field(default_factory=dict)  # agent -> path in its data dir
    resumed_at: list[int] = field(default_factory=list)  # train_steps of each resume
    train_returns: list[list[float]] = field(default_factory=list)  # [env steps, return]
    done: bool = False  # an evaluation reached stop_value


class Checkpoints:
    """Saves each agent's checkpoint at an evaluation and keeps the last `keep` of those in
    the data dirs this harness can reach (`local_dirs`: the agents it started here).

    With `mirror` (a run on a cluster, where an agent's data dir is on its node and goes
    when the node goes), each checkpoint is also copied over HTTP (`getFile`) into
    ``mirror/AGENT/``, and `restore` puts it back (`putFile`) into a restarted agent."""

    def __init__(
        self,
        agents: dict[str, AgentClient],
        keep: int,
        local_dirs: dict[str, Path],
        timeout: float,
        mirror: Optional[Path] = None,
    ) -> None:
        self.agents, self.keep, self.local_dirs, self.timeout = agents, keep, local_dirs, timeout
        self.mirror = mirror

    def save(self, train_steps: int) -> dict[str, str]:
        path = f"checkpoints/step-{train_steps}.pt"
        for name, agent in self.agents.items():
            agent.save_model(path, timeout=self.timeout)
            if self.mirror is not None:
                atomic_write_bytes(
                    self.mirror / name / path, agent.get_file(path, timeout=self.timeout)
                )
        return dict.fromkeys(self.agents, path)

    def prune(self) -> None:
        """Delete all but the newest `keep` (by env steps); call once progress points at the
        newest, so that the checkpoint it names always exists."""
        dirs = list(self.local_dirs.values())
        if self.mirror is not None:
            dirs += [self.mirror / name for name in self.agents]
        for data_dir in dirs:
            saved = sorted(
                (data_dir / "checkpoints").glob("step-*.pt"),
                key=lambda p: int(p.stem.removeprefix("step-")),
            )
            for old in saved[: -self.keep]:
                old.unlink(missing_ok=True)


def restore_checkpoint(
    agent: AgentClient, mirror: Path, name: str, path: str, timeout: float
) -> None:
    """Put agent `name`'s mirrored checkpoint `path` (`Checkpoints.mirror`) into its data
    dir, to build its model from: a restarted agent on another node has none."""
    copy = mirror / name / path
    if not copy.is_file():
        raise RunConfigError(f"the checkpoint {path} of agent {name!r} was not copied to {copy}")
    agent.put_file(path, copy.read_bytes(), timeout=timeout)


def resumed_seed(seed: int, evals_done: int) -> int:
    """The training envs' seed after a resume: a fresh stream per resume point, the same
    every time that point is resumed."""
    return int(np.random.SeedSequence([seed, evals_done]).generate_state(1)[0])


def train(
    orch: OrchestratorClient,
    spec: TrainingSpec,
    run_dir: Path,
    timeout: float,
    say: Callable[[str], None],
    checkpoints: Optional[Checkpoints] = None,
    progress: Optional[Progress] = None,
    quiet: bool = False,
    title: str = "",
    schedule: Optional[Callable[..., "GymSchedule"]] = None,
    stop_line: str = "reached stop_value {}: stopping",
    agents: Optional[Mapping[str, AgentSettings]] = None,
    episodes: Optional[EpisodesFile] = None,
) -> Progress:
    """Run the training loop (`harness.loop`), from the start or from `progress`; returns
    where it ended (the evaluations are also written to disk). `schedule` makes the
    schedule from (orch, spec, run_dir, timeout, progress, resumed, title, episodes=): a
    `GymSchedule` by default, a solo league's (`harness.league`) otherwise. `agents`: how
    agents play in the default schedule's episodes (e.g. local inference). `episodes`: the
    run's episodes.jsonl, appended at each checkpoint (by default opened here)."""
    resumed = progress is not None
    progress = progress or Progress()
    if resumed:
        progress.resumed_at.append(progress.train_steps)
    made = (schedule or partial(GymSchedule, agents=agents or {}))(
        orch, spec, run_dir, timeout, progress, resumed, title, episodes=episodes
    )
    run_loop(
        made,
        progress.wall_s,
        say,
        checkpoints,
        quiet,
        progress.evals[-1]["mean_return"] if progress.evals else None,
        stop_line.format(spec.stop_value),
        done=progress.done,
    )
    return progress


class GymSchedule:
    """Gym training for `run_loop`: blocks of training episodes over `num_envs` env copies
    that stop exactly at each evaluation point and continue their episodes afterwards, and
    greedy evaluations on fixed seeds; the curve goes to TensorBoard, CSV and PNG. (A solo
    league's schedule, `harness.league`, trains and evaluates its own way and keeps the
    rest.)"""

    unit, eval_label = "env steps", "last eval"

    def __init__(
        self,
        orch: OrchestratorClient,
        spec: TrainingSpec,
        run_dir: Path,
        timeout: float,
        progress: Progress,
        resumed: bool,
        title: str,
        agents: Optional[Mapping[str, AgentSettings]] = None,
        episodes: Optional[EpisodesFile] = None,
    ) -> None:
        self.orch, self.spec, self.run_dir, self.timeout = orch, spec, run_dir, timeout
        self.agents = dict(agents or {})  # how agents play in its episodes
        self.progress, self.title = progress, title
        self.budget, self.eval_every = spec.env_steps, spec.eval_every
        self.seed = resumed_seed(spec.seed, len(progress.evals)) if resumed else spec.seed
        self.episodes = episodes or EpisodesFile(run_dir, progress.episodes_saved)
        self.writer = tensorboard_writer(
            run_dir / "tensorboard", purge_step=progress.train_steps + 1 if resumed else None
        )

    def steps(self) -> int:
        return self.progress.train_steps

    def train_block(self, target: int, shown: TrainingProgress) -> None:
        done = self.progress.train_steps
        steps, episodes = _train_block(
            self.orch,
            self.spec,
            target - done,
            self.seed,
            self.timeout,
            lambda block: shown.update(done + block),
            self.agents,
        )
        self.progress.train_steps += steps
        self.progress.train_episodes += len(episodes)
        for at, e in episodes:
            self.writer.add_scalar("train/episode_return", e.return_, done + at)
            self.progress.train_returns.append([done + at, e.return_])

    def evaluate(self, wall_s: float) -> Evaluated:
        result = evaluate_returns(self.orch, self.spec, self.timeout, self.agents)
        progress = self.progress
        progress.evals.append(
            {
                "env_steps": progress.train_steps,
                "wall_s": wall_s,
                "mean_return": result.mean_return,
                "std_return": result.std_return,
                "returns": result.returns,
                "train_episodes": progress.train_episodes,
            }
        )
        progress.done = result.stop
        self.writer.add_scalar("eval/mean_return", result.mean_return, progress.train_steps)
        self.writer.add_scalar("eval/wall_s", wall_s, progress.train_steps)
        self.writer.flush()
        return Evaluated(
            result.mean_return,
            (
                f"  eval at {progress.train_steps:7d} env steps ({wall_s:7.1f} s): mean return "
                f"{result.mean_return:7.2f} ± {result.std_return:.2f} over "
                f"{len(result.returns)} episodes"
            ),
            result.stop,
        )

    def save(self, checkpoints: dict[str, str], wall_s: float) -> None:
        self.progress.checkpoints = checkpoints
        self.progress.episodes_saved = self.episodes.sync(self.orch)
        self.progress.wall_s = wall_s
        self.progress.save(self.run_dir)

    def close(self) -> None:
        self.writer.close()
        write_curve(
            self.progress.evals,
            self.run_dir,
            self.spec.stop_value,
            self.progress.train_returns,
            f"{self.title or self.run_dir.name} (seed {self.spec.seed})",
        )


def _train_block(
    orch: OrchestratorClient,
    spec: TrainingSpec,
    budget: int,
    seed: int,
    timeout: float,
    on_steps: Callable[[int], None] = lambda steps: None,
    agents: Optional[Mapping[str, AgentSettings]] = None,
) -> tuple[int, list[tuple[int, EpisodeResult]]]:
    """Train for exactly `budget` env steps; returns the steps taken and the episodes
    finished, each with the block's env steps when it ended (`on_steps` hears the block's
    steps as the orchestrator reports them).
    `resume`: the block stops at the budget and the next one continues its episodes, so
    evaluating never cuts or restarts a training episode (`seed` seeds the envs' first
    episodes only)."""
    steps_before = orch.progress().env_steps
    played = orch.play(
        EpisodeConfig(
            num_steps=budget,
            seed=seed,
            max_steps=spec.max_steps,
            train=True,
            num_envs=spec.num_envs,
            env_manager=spec.env_manager,
            resume=True,
            pipeline_depth=spec.pipeline_depth,
            agents=dict(agents or {}),
        ),
        timeout=timeout,
        on_status=lambda status: on_steps(
            status.payload.get("envSteps", steps_before) - steps_before
        ),
    )
    return played.env_steps, [
        (played.env_steps if e.env_steps is None else e.env_steps - steps_before, e)
        for e in played.episodes
    ]


def evaluate_returns(
    orch: OrchestratorClient,
    spec: TrainingSpec,
    timeout: float,
    agents: Optional[Mapping[str, AgentSettings]] = None,
) -> EvalResult:
    """`eval_episodes` greedy episodes on the fixed evaluation seeds."""
    episodes = orch.play(
        EpisodeConfig(
            num_episodes=spec.eval_episodes,
            seed=spec.eval_seed,
            max_steps=spec.max_steps,
            train=False,
            num_envs=spec.eval_envs or spec.eval_episodes,
            env_manager=spec.env_manager,
            agents=dict(agents or {}),
        ),
        timeout=timeout,
    ).episodes
    return summarize([e.return_ for e in episodes if not e.abnormal], spec.stop_value)


def write_curve(
    evals: list[dict],
    run_dir: Path,
    stop_value: Optional[float] = None,
    train_returns: Sequence[Sequence[float]] = (),
    title: str = "",
) -> None:
    """``evals.csv`` and ``learning_curve.png``: mean ± std eval return vs training env
    steps, the training episodes' returns (rolling mean of `ROLLING`), the stop value."""
    _write_evals_csv(evals, run_dir)
    if not evals:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if len(train_returns):
        _plot_train_returns(ax, train_returns)
    _plot_evals(ax, evals, stop_value)
    ax.set_xlabel("training env steps")
    ax.set_ylabel("episode return")
    ax.set_title(title or run_dir.name)
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "learning_curve.png", dpi=100)
    plt.close(fig)


def _write_evals_csv(evals: list[dict], run_dir: Path) -> None:
    """``evals.csv``: a row per evaluation (the header alone before the first)."""
    with open(run_dir / "evals.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["env_steps", "wall_s", "mean_return", "std_return"])
        for e in evals:
            out.writerow([e["env_steps"], e["wall_s"], e["mean_return"], e["std_return"]])


def _plot_train_returns(ax: Any, train_returns: Sequence[Sequence[float]]) -> None:
    """Each training episode's return as a faint dot, and their rolling mean: single
    episodes are too noisy to read a trend from."""
    at, returns = np.asarray(train_returns, dtype=float).T
    window = min(ROLLING, len(returns))
    rolling = np.convolve(returns, np.ones(window) / window, mode="valid")
    ax.plot(
        at,
        returns,
        ".",
        color="tab:gray",
        alpha=0.25,
        markersize=3,
        label="training episodes (each)",
    )
    ax.plot(
        at[window - 1 :],
        rolling,
        color="tab:gray",
        label=f"training episodes (mean of {window})",
    )


def _plot_evals(ax: Any, evals: list[dict], stop_value: Optional[float]) -> None:
    """The evaluations' mean return with a ± std band, and the stop value as a line."""
    steps = [e["env_steps"] for e in evals]
    mean = [e["mean_return"] for e in evals]
    std = [e["std_return"] for e in evals]
    ax.plot(steps, mean, marker="o", color="tab:blue", label="evaluation mean ± std")
    ax.fill_between(
        steps,
        [m - s for m, s in zip(mean, std)],
        [m + s for m, s in zip(mean, std)],
        alpha=0.2,
        color="tab:blue",
    )
    if stop_value is not None:
        ax.axhline(
            stop_value, color="tab:green", linestyle="--", label=f"stop value {stop_value:g}"
        )


class ScalarWriter(Protocol):
    """What the harness logs to TensorBoard through (torch's `SummaryWriter`, or nothing)."""

    def add_scalar(self, tag: str, value: float, step: Optional[int] = None, /) -> None: ...
    def add_figure(self, tag: str, figure: Any, step: Optional[int] = None, /) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class _NullWriter:
    def add_scalar(self, *args: object) -> None: ...
    def add_figure(self, *args: object) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def tensorboard_writer(log_dir: Path, purge_step: Optional[int] = None) -> ScalarWriter:
    """A writer; `purge_step` hides what a crashed run logged from that step on."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: the CSV and PNG still get written
        return _NullWriter()
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


def first_success(evals: list[dict], stop_value: Optional[float]) -> Optional[dict]:
    """The first evaluation whose mean reached `stop_value`."""
    if stop_value is None:
        return None
    return next((e for e in evals if e["mean_return"] >= stop_value), None)
