"""`mistk-rl run CONFIG.yaml`: the MISTK sequence over HTTP, from start to clean-up.

orchestrator initialize -> per agent initialize, buildModel, registerAgent -> for each episode
block startEpisode (progress followed by long-poll), saveEpisode, stopEpisode -> agents
saveModel -> reset and terminate everything -> results.json. Services the config names by
`target` are started on free loopback ports and always stopped, also on failure.

This module runs a run (and resumes, restarts and reports it); the services and the clients
on them are `harness.run_services`'s, the sequence itself `harness.sequence`'s.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml

from harness.config import (
    RunConfig,
    RunConfigError,
    load_config,
    resume_config,
    with_cluster,
    with_eval_episodes,
    with_seed,
)
from harness.dashboard import Dashboard
from harness.episodes import EPISODES, EpisodesFile
from harness.episodes import read_episodes as read_episodes
from harness.games import GameProgress, summary
from harness.ladder import table as ladder_table
from harness.league import table_text
from harness.run_services import RunClients, RunServices, keep_workers
from harness.run_services import data_dir as data_dir
from harness.sequence import HarnessError, MistkSequence, progress_kind
from harness.sequence import last_checkpoint as last_checkpoint
from harness.sequence import saved_model as saved_model
from harness.training import Progress, first_success
from mistk_rl.deploy.cluster import ClusterError
from mistk_rl.files import atomic_write_json
from mistk_rl.sdk.client import ServiceError
from mistk_rl.wire.tracing import new_trace, traced


class ServicesLost(HarnessError):
    """A run on a cluster failed because services it started are gone (their node was lost,
    or they were killed): `run_restarting` starts them again and resumes."""

    def __init__(self, names: list[str], cause: BaseException) -> None:
        super().__init__(f"lost {', '.join(names)} ({cause})")
        self.names = names


class Stopped(BaseException):
    """The harness got SIGTERM or SIGHUP: unwind (stopping every service it started)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def run_from_file(
    config_path: Optional[Path],
    out: Optional[Path] = None,
    quiet: bool = False,
    seed: Optional[int] = None,
    resume: Optional[Path] = None,
    evaluate_only: bool = False,
    cluster: Optional[str] = None,
    max_restarts: Optional[int] = None,
    eval_episodes: Optional[int] = None,
    dashboard_port: Optional[int] = None,
) -> int:
    """CLI entry: run (with `seed` for every seed in the config, if given), or continue the
    run in `resume` from its last checkpoint, or (`evaluate_only`, `mistk-rl eval`) run only
    the config's evaluation (`eval_episodes`: a single-agent one's episodes); `cluster`:
    place the services on the Ray cluster at that address. A run on a cluster that loses
    services resumes by itself from its last checkpoint, at most `max_restarts` times
    (default 3 on a cluster, 0 without). `dashboard_port`: serve the run's dashboard
    (`harness.dashboard`) on 127.0.0.1 at that port (0: a free one) while it goes. Prints
    a summary, returns the exit code."""
    say = (lambda *_: None) if quiet else (lambda msg: print(msg, flush=True))
    program = "mistk-rl eval" if evaluate_only else "mistk-rl run"
    run_dir: Optional[Path] = None
    with _unwinding_on_signals():
        try:
            progress = None
            if resume is not None:
                config, run_dir = _resumed_config(resume, out, config_path, seed), resume
                finished = _finished(config, resume)
                if finished:  # nothing to do, and nothing in the run dir is touched
                    print(
                        f"mistk-rl run: the run in {resume} has finished ({finished}): "
                        f"nothing to resume; its results are in {resume / 'results.json'}",
                        file=sys.stderr,
                    )
                    return 0
                progress = progress_kind(config).load(resume)
            else:
                assert config_path is not None  # (the CLI asks for CONFIG without --resume)
                config = load_config(config_path)
                if seed is not None:
                    config = with_seed(config, seed)
                run_dir = out or Path("runs") / f"{config.name}-{datetime.now():%Y%m%d-%H%M%S}"
            if cluster is not None:
                config = with_cluster(config, cluster)
            if eval_episodes is not None:
                config = with_eval_episodes(config, eval_episodes)
            restarts = restarts_allowed(config, max_restarts)
            with _dashboard(run_dir, dashboard_port) as shown:
                if shown is not None:
                    print(f"{program}: dashboard at {shown.url}", flush=True)
                results = run_restarting(
                    config, run_dir, say, progress, quiet, evaluate_only, restarts
                )
        except (RunConfigError, HarnessError, ClusterError) as exc:
            print(f"{program}: {exc}", file=sys.stderr)
            return 1
        except (Stopped, KeyboardInterrupt) as exc:
            return _interrupted(program, exc, run_dir)
    _say_results(config, results, run_dir, say)
    return 0


@contextmanager
def _dashboard(run_dir: Path, port: Optional[int]) -> Iterator[Optional[Dashboard]]:
    """The run's dashboard while it goes (none: `port` None)."""
    if port is None:
        yield None
        return
    with Dashboard([run_dir], port=port) as shown:
        yield shown


@contextmanager
def _unwinding_on_signals() -> Iterator[None]:
    """SIGINT already unwinds (KeyboardInterrupt); SIGTERM and SIGHUP do the same inside,
    so the services a run started are stopped whichever way it is ended. (Signal handlers
    can only be set in the main thread: elsewhere nothing changes.)"""
    previous = (
        {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
        if threading.current_thread() is threading.main_thread()
        else {}
    )
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _resumed_config(
    resume: Path, out: Optional[Path], config_path: Optional[Path], seed: Optional[int]
) -> RunConfig:
    """The config the run in `resume` ran with (`resume_config`); it stays in its dir."""
    if out is not None:
        raise RunConfigError(
            "--resume continues the run in its own directory: --out does not apply"
        )
    return resume_config(resume, config_path, seed)


def _interrupted(program: str, exc: Stopped | KeyboardInterrupt, run_dir: Optional[Path]) -> int:
    """Say that the run was ended and what it left; the shell's exit code for the signal."""
    why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc)
    print(
        f"{program}: {why}; the services it started are stopped{_what_is_left(run_dir)}",
        file=sys.stderr,
    )
    return 130 if isinstance(exc, KeyboardInterrupt) else 128 + exc.signum


def _say_results(
    config: RunConfig, results: dict, run_dir: Path, say: Callable[[str], None]
) -> None:
    """The summary lines of a finished run: its evaluation, league table and episodes."""
    if "evaluation" in results and config.evaluation is not None:
        report = results.get("evaluation_detail") or results["evaluation"]
        say(f"evaluation of {config.evaluation.agent}: {summary(report)}")
    elif "evaluation" in results:  # a single-agent run's (mistk-rl eval of a gym config)
        assert config.training is not None  # (`_save_config` refuses an eval of neither)
        report = results["evaluation"]
        returns = ", ".join(f"{r:g}" for r in report["returns"])
        say(
            f"evaluation: mean return {report['mean_return']:.2f}, std "
            f"{report['std_return']:.2f} over {len(report['returns'])} greedy episodes "
            f"(seeds from {config.training.eval_seed}): {returns}"
        )
    if results.get("league"):
        say(table_text(results["league"]))
        if results.get("first_pass"):
            say(
                f"first passing evaluation at {results['first_pass']['agent_steps']} steps "
                f"({results['first_pass']['wall_s']} s); kept: {results['checkpoint']}"
            )
    if results.get("ladder"):
        say(ladder_table(results["ladder"]))
        say(f"the ladder's games and plots: {run_dir} (ladder.json, ratings.png, headtohead.png)")
    if results.get("episode_count"):
        say(
            f"{results['episode_count']} episodes, mean return "
            f"{results['episode_mean_return']:.2f}; wall {results['wall_s']:.2f} s; results in "
            f"{run_dir / 'results.json'} (each episode: {run_dir / EPISODES})"
        )


def restarts_allowed(config: RunConfig, given: Optional[int]) -> int:
    """``--max-restarts``: as given, else 3 on a cluster (where nodes come and go), else 0."""
    if given is not None:
        return given
    return 3 if config.cluster is not None else 0


def _what_is_left(run_dir: Optional[Path]) -> str:
    """Where an ended run left its partial results, and how to go on from them."""
    if run_dir is None or not run_dir.exists():
        return ""
    if (run_dir / "progress.json").exists():
        return (
            f"; what it did so far is in {run_dir} (continue with "
            f"'mistk-rl run --resume {run_dir}')"
        )
    return f"; its logs are in {run_dir / 'logs'} (no checkpoint yet: nothing to resume)"


def run_restarting(
    config: RunConfig,
    run_dir: Path,
    say: Callable[[str], None],
    progress: Optional[Progress | GameProgress],
    quiet: bool,
    evaluate_only: bool,
    max_restarts: int,
) -> dict:
    """`run`; when services are lost, start them all again and resume from the last
    checkpoint (from the start, if none was saved yet), as ``--resume`` would, after a
    growing pause (2, 4, 8 ... 30 s), at most `max_restarts` times."""
    restarts = 0
    while True:
        try:
            return run(
                config,
                run_dir,
                say=say,
                resume=progress,
                quiet=quiet,
                evaluate_only=evaluate_only,
                max_restarts=max_restarts,
            )
        except ServicesLost as exc:
            if restarts >= max_restarts:
                raise HarnessError(
                    f"{exc}; not restarted again: {restarts} restarts so far, "
                    f"--max-restarts {max_restarts}"
                ) from exc
            restarts += 1
            try:
                progress = progress_kind(config).load(run_dir)
                where = "its last checkpoint"
            except RunConfigError:
                progress, where = None, "the start (no checkpoint yet)"
            pause = min(2.0**restarts, 30.0)
            say(
                f"{exc}: starting the run's services again in {pause:.0f} s and resuming "
                f"from {where} (restart {restarts} of at most {max_restarts})"
            )
            time.sleep(pause)  # backing off: a node that keeps failing is not hammered


def _finished(config: RunConfig, run_dir: Path) -> Optional[str]:
    """How the run in `run_dir` finished (a phrase), or None when there is more to do:
    ``results.json``, written last, is there, and its training (if any) reached the end the
    config sets (a config edited to train on since then is not finished)."""
    if not (run_dir / "results.json").is_file():
        return None
    if config.game_training is None and config.training is None:
        return "it ran every episode block"
    try:
        done, total, unit, stopped = _training_stands(config, run_dir)
    except RunConfigError:  # no checkpoints (so no progress.json): results.json says it ended
        return "it trained to its end"
    if stopped:
        return f"an evaluation met its stop target after {done:,} {unit} steps"
    if done >= total:
        return f"it trained {done:,} of {total:,} {unit} steps"
    return None


def _training_stands(config: RunConfig, run_dir: Path) -> tuple[int, int, str, bool]:
    """From the run's progress.json: its steps so far, the config's budget of them, their
    unit, and whether an evaluation stopped the run."""
    if config.game_training is not None:
        games = GameProgress.load(run_dir)
        return games.agent_steps, config.game_training.agent_steps, "agent", games.done
    assert config.training is not None  # (a run of episode blocks keeps no progress)
    gym = Progress.load(run_dir)
    return gym.train_steps, config.training.env_steps, "env", gym.done


def run(
    config: RunConfig,
    run_dir: Path,
    say: Callable[[str], None] = print,
    resume: Optional[Progress | GameProgress] = None,
    quiet: bool = False,
    evaluate_only: bool = False,
    max_restarts: Optional[int] = None,
) -> dict:
    """Run the whole sequence, or continue a training run from `resume` (its progress file:
    agents load their checkpoints, training goes on from its schedule); returns what it
    writes to ``run_dir/results.json``. `evaluate_only`: only the config's evaluation, with
    the agents built from their model_path, else from the save_path a run in `run_dir` left;
    written to ``run_dir/evaluation.json``. On a cluster, a league's lost workers are
    started again elsewhere, each at most `max_restarts` times (`harness.keeper`; default 3
    on a cluster, as ``--max-restarts``).

    The phases, in order: the config saved (`_save_config`), the services started and
    waited for (`RunServices.start`), clients on them (`RunClients`), a league's placed
    workers kept (`keep_workers`), the sequence itself (`MistkSequence`), the results
    (`_results`)."""
    max_restarts = restarts_allowed(config, max_restarts)
    started = time.monotonic()
    _save_config(config, run_dir, evaluate_only)
    token = config.token or os.environ.get("MISTK_RL_TOKEN")
    with ExitStack() as stack:
        # one trace for the run: its calls, and those they cause in the services, carry it
        trace = stack.enter_context(traced(new_trace()))
        services = RunServices(config, run_dir, stack, say, token)
        services.start()
        placement = services.placement()
        clients = RunClients(config, services, stack, token)
        keeper = None if evaluate_only else keep_workers(services, stack, say, max_restarts)
        try:
            episodes, progress, outcome = MistkSequence(
                config,
                services.env,
                clients.orch,
                clients.agents,
                services.agent_urls,
                run_dir,
                say,
                resume,
                quiet,
                evaluate_only,
                clients.evaluator,
                services.local_dirs(),
                run_dir / "checkpoints" if services.cluster else None,  # (copied as saved)
            ).run()
        except (HarnessError, ServiceError) as exc:  # (a lost service fails some call)
            lost = services.lost(keeper.replaced if keeper else [])
            if lost:
                raise ServicesLost(lost, exc) from exc
            raise
        if keeper is not None:
            keeper.stop()
            placement.update(keeper.placement())
    if placement:  # where the cluster ran each service
        outcome["placement"] = placement
    outcome["trace_id"] = trace.trace_id  # (the services' log lines of this run carry it)
    return _results(config, run_dir, episodes, progress, outcome, started, evaluate_only)


def _save_config(config: RunConfig, run_dir: Path, evaluate_only: bool) -> None:
    """Refuse an evaluation with nothing to evaluate; write the run's config.yaml (without
    the token: a resumed run takes it from the environment)."""
    if evaluate_only and config.evaluation is None and config.training is None:
        raise RunConfigError(
            "nothing to evaluate: the config has neither an 'evaluation' block "
            "(games) nor a 'training' block (its eval_episodes, eval_seed)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = config.model_dump()
    if saved.get("token"):
        saved["token"] = None
    if not evaluate_only:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))


def _results(
    config: RunConfig,
    run_dir: Path,
    episodes: Optional[EpisodesFile],
    progress: Any,
    outcome: dict,
    started: float,
    evaluate_only: bool,
) -> dict:
    """The run's results, written to results.json (evaluation.json for an evaluation),
    with the episodes beside them."""
    wall_s = round(time.monotonic() - started, 3)
    if evaluate_only:
        results = {
            "name": config.name,
            "evaluation": outcome["evaluation"],
            "wall_s": wall_s,
            **outcome,
        }
        atomic_write_json(run_dir / "evaluation.json", results)
        return results
    assert episodes is not None  # (`MistkSequence.run` keeps them for all but evaluations)
    mean = episodes.mean_return
    results = {
        "name": config.name,
        "episodes_file": EPISODES,
        "episode_count": episodes.count,
        "episode_mean_return": None if mean is None else round(mean, 6),
        "wall_s": wall_s,
        **outcome,
    }
    if config.training is not None:
        results["evals"] = evals = progress.evals
        if progress.resumed_at:
            results["resumed_at"] = progress.resumed_at  # env steps of each resume
        success = first_success(evals, config.training.stop_value)
        results["first_success"] = success and {
            k: success[k] for k in ("env_steps", "wall_s", "mean_return")
        }
    atomic_write_json(run_dir / "results.json", results)
    return results


def main() -> int:  # python -m harness.run CONFIG
    return run_from_file(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
