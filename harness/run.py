"""`mistk-rl run CONFIG.yaml`: the MISTK sequence over HTTP, from start to clean-up.

orchestrator initialize -> per agent initialize, buildModel, registerAgent -> for each episode
block startEpisode (progress followed by long-poll), saveEpisode, stopEpisode -> agents
saveModel -> reset and terminate everything -> results.json. Services the config names by
`target` are started on free loopback ports and always stopped, also on failure.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Optional, TypeVar

import numpy as np
import yaml

from harness.config import (
    AgentSpec,
    RunConfig,
    RunConfigError,
    ServiceSpec,
    load_config,
    resume_config,
    with_cluster,
    with_eval_episodes,
    with_seed,
)
from harness.games import GameProgress, evaluate, summary, train_games
from harness.keeper import KeptWorker, WorkerKeeper
from harness.league import Evaluator, league_results, table_text, train_solo_league
from harness.training import (
    Checkpoints,
    Progress,
    evaluate_returns,
    first_success,
    restore_checkpoint,
    run_episodes,
    train,
)
from mistk_rl.deploy.cluster import Cluster, ClusterError, PlacedService, Resources
from mistk_rl.deploy.launch import ServiceProcess, ServiceStartError, spawn_service
from mistk_rl.files import atomic_write_bytes, atomic_write_json
from mistk_rl.sdk.client import AgentClient, OrchestratorClient, ServiceError
from mistk_rl.sdk.schemas import EpisodeConfig, Status


class HarnessError(RuntimeError):
    """A step of the run failed; the message says which and why."""


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
) -> int:
    """CLI entry: run (with `seed` for every seed in the config, if given), or continue the
    run in `resume` from its last checkpoint, or (`evaluate_only`, `mistk-rl eval`) run only
    the config's evaluation (`eval_episodes`: a single-agent one's episodes); `cluster`:
    place the services on the Ray cluster at that address. A run on a cluster that loses
    services resumes by itself from its last checkpoint, at most `max_restarts` times
    (default 3 on a cluster, 0 without). Prints a summary, returns the exit code."""
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
                progress = _progress_kind(config).load(resume)
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
            results = run_restarting(config, run_dir, say, progress, quiet, evaluate_only, restarts)
        except (RunConfigError, HarnessError, ClusterError) as exc:
            print(f"{program}: {exc}", file=sys.stderr)
            return 1
        except (Stopped, KeyboardInterrupt) as exc:
            return _interrupted(program, exc, run_dir)
    _say_results(config, results, run_dir, say)
    return 0


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
    if results.get("episode_count"):
        say(
            f"{results['episode_count']} episodes, mean return "
            f"{results['episode_mean_return']:.2f}; wall {results['wall_s']:.2f} s; results in "
            f"{run_dir / 'results.json'} (each episode: {run_dir / EPISODES})"
        )


EPISODES = "episodes.jsonl"  # results.json's episodes, one JSON object a line, beside it


def write_episodes(run_dir: Path, episodes: list[dict]) -> None:
    """Every episode (game) of the run, one JSON object a line: results.json keeps the
    summary a person opens (a 100k-move tic-tac-toe run plays ~28,000 games)."""
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in episodes)
    atomic_write_bytes(run_dir / EPISODES, text.encode())


def read_episodes(run_dir: Path) -> list[dict]:
    """The episodes a run wrote (`write_episodes`)."""
    with open(run_dir / EPISODES) as fh:
        return [json.loads(line) for line in fh if line.strip()]


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
                progress = _progress_kind(config).load(run_dir)
                where = "its last checkpoint"
            except RunConfigError:
                progress, where = None, "the start (no checkpoint yet)"
            pause = min(2.0**restarts, 30.0)
            say(
                f"{exc}: starting the run's services again in {pause:.0f} s and resuming "
                f"from {where} (restart {restarts} of at most {max_restarts})"
            )
            time.sleep(pause)  # backing off: a node that keeps failing is not hammered


def _progress_kind(config: RunConfig) -> type[Progress] | type[GameProgress]:
    """The progress.json a run of this config keeps: a game run's, or a gym run's."""
    return GameProgress if config.game_training else Progress


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
    waited for (`_RunServices.start`), clients on them (`_RunClients`), a league's placed
    workers kept (`_keep_workers`), the sequence itself (`_Sequence`), the results
    (`_results`)."""
    max_restarts = restarts_allowed(config, max_restarts)
    started = time.monotonic()
    _save_config(config, run_dir, evaluate_only)
    token = config.token or os.environ.get("MISTK_RL_TOKEN")
    with ExitStack() as stack:
        services = _RunServices(config, run_dir, stack, say, token)
        services.start()
        placement = services.placement()
        clients = _RunClients(config, services, stack, token)
        keeper = None if evaluate_only else _keep_workers(services, stack, say, max_restarts)
        try:
            episodes, progress, outcome = _Sequence(
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


class _RunServices:
    """The services of one run: started here as processes or on the cluster the config
    names, each stopped when `stack` closes; or given by URL in the config."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        stack: ExitStack,
        say: Callable[[str], None],
        token: Optional[str],
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.stack = stack
        self.say = say
        self.token = token
        self.spawned: list[tuple[str, ServiceProcess | PlacedService]] = []
        self.cluster: Optional[Cluster] = None
        if config.cluster is not None:  # (closed last: after every service is stopped)
            self.cluster = Cluster(
                config.cluster.address,
                run_id=run_dir.resolve().name,
                data_root=config.cluster.data_root,
            )
            stack.callback(self.cluster.close)
            say(
                f"placing services on the Ray cluster at {config.cluster.address} "
                f"({len(self.cluster.node_addresses())} nodes)"
            )
        self.env = config.orchestrator.env.model_dump(exclude_none=True)  # initialize's
        self.workers: list[str | ServiceProcess | PlacedService] = []  # config.workers'
        self.orch_url = ""
        self.agent_urls: dict[str, str] = {}
        self.evaluator_url: Optional[str] = None

    def launch(
        self,
        role: str,
        name: str,
        spec: ServiceSpec,
        extra: tuple[str, ...] = (),
        near_driver: bool = False,
    ) -> ServiceProcess | PlacedService:
        """Start a service here or on the cluster (they all boot side by side; `start`
        waits); `near_driver`: on this process's node if it can hold it."""
        args = (*spec.args, *extra)
        assert spec.target is not None  # (a spec without one has the url of a running service)
        if self.cluster is not None:
            service: ServiceProcess | PlacedService = self.cluster.spawn(
                role,
                name,
                spec.target,
                token=self.token,
                extra_args=args,
                resources=Resources(spec.cpus, spec.gpus, spec.resources),
                near_driver=near_driver,
            )
        else:
            service = spawn_service(
                role,
                spec.target,
                data_dir=data_dir(self.run_dir, name),
                log_path=self.run_dir / "logs" / f"{name}.log",
                token=self.token,
                extra_args=args,
            )
        self.kept(name, service)
        return service

    def kept(self, name: str, service: ServiceProcess | PlacedService) -> None:
        """A service of this run (one the keeper starts again, too): stopped at the end."""
        self.stack.callback(_stop, service, self.say)
        self.spawned.append((name, service))

    def start(self) -> None:
        """Start every service the config names without a URL, and wait until each answers;
        a league's workers go into initialize's env."""
        config, orch_spec = self.config, self.config.orchestrator
        # orchestrators on a cluster call agents on other nodes
        allow = tuple(
            arg
            for host in (self.cluster.node_addresses() if self.cluster else ())
            for arg in ("--allow-agent-host", host)
        )
        share = self._league_services(allow)
        # a league's state (league.json, every checkpoint) is in its orchestrator's data dir:
        # unless its config pins it, it runs on this node, next to the run dir, so losing
        # it is losing this run's driver too, which `--resume` continues (it finds the league)
        orch = orch_spec.url or self.launch(
            "orchestrator",
            "orchestrator",
            orch_spec,
            allow + share,
            near_driver=orch_spec.env.league is not None and not orch_spec.resources,
        )
        agents = {a.name: a.url or self.launch("agent", a.name, a, share) for a in config.agents}
        self._wait_ready()
        if self.workers:
            league = self.env["league"]
            self.env["league"] = {
                **league,
                "workers": list(league.get("workers", ())) + [_url(w) for w in self.workers],
            }
        self.orch_url = _url(orch)
        self.agent_urls = {name: _url(service) for name, service in agents.items()}

    def _league_services(self, allow: tuple[str, ...]) -> tuple[str, ...]:
        """A league's workers and (a solo league's) evaluator, started; the `--share` of its
        directory that its services get when they share this machine's file system."""
        config, league = self.config, self.config.orchestrator.env.league
        if league is None:
            return ()
        share: tuple[str, ...] = ()
        if self.cluster:  # no shared file system: checkpoints move over HTTP
            self.env["league"] = {**self.env["league"], "copyCheckpoints": True}
        else:  # the league's directory, shared by its services
            name = str(league.get("directory", "league")).split("/")[0]
            share = ("--share", f"{name}={(self.run_dir / name).resolve()}")
        self.workers = [
            w.url or self.launch("orchestrator", f"worker{i}", w, allow)
            for i, w in enumerate(config.workers)
        ]
        if config.orchestrator.env.solo_players() is not None:  # its players' evaluations
            spec = config.evaluator or _default_evaluator(config)
            self.evaluator_url = _url(
                spec.url or self.launch("orchestrator", "evaluator", spec, allow)
            )
        return share

    def _wait_ready(self) -> None:
        # (callbacks run last first: this one SIGTERMs every service, then each is waited for)
        self.stack.callback(lambda: [service.begin_stop() for _, service in self.spawned])
        for name, service in self.spawned:
            try:
                service.wait_ready(self.config.timeouts.startup)
            except ServiceStartError as exc:
                raise HarnessError(f"starting {service.role} {name!r}: {exc}") from exc
            where = f" on node {service.node_id[:12]}" if isinstance(service, PlacedService) else ""
            self.say(f"started {service.role} {name} ({service.target}) at {service.url}{where}")

    def local_dirs(self) -> dict[str, Path]:
        """The data dirs of the agents this harness started, where it can reach them."""
        if self.cluster:
            return {}
        return {a.name: data_dir(self.run_dir, a.name) for a in self.config.agents if a.target}

    def placement(self) -> dict[str, dict]:
        """Where the cluster placed each service: its URL and node."""
        return {
            name: {"url": s.url, "node": s.node_id}
            for name, s in self.spawned
            if isinstance(s, PlacedService)
        }

    def lost(self, replaced: list) -> list[str]:
        """On a cluster, the services that died and were not started again."""
        return [
            name
            for name, s in self.spawned
            if self.cluster and not any(s is r for r in replaced) and not s.alive()
        ]


class _RunClients:
    """The SDK's clients on a run's services, closed when `stack` closes."""

    def __init__(
        self, config: RunConfig, services: _RunServices, stack: ExitStack, token: Optional[str]
    ) -> None:
        call = config.timeouts.call
        self.orch = stack.enter_context(
            OrchestratorClient(services.orch_url, token=token, timeout=call)
        )
        self.agents = {
            name: stack.enter_context(AgentClient(url, token=token, timeout=call))
            for name, url in services.agent_urls.items()
        }
        self.evaluator = (
            Evaluator(
                stack.enter_context(
                    OrchestratorClient(services.evaluator_url, token=token, timeout=call)
                ),
                {"id": services.env["id"], "kwargs": services.env.get("kwargs", {})},
                services.agent_urls,
                call,
            )
            if services.evaluator_url
            else None
        )


def _keep_workers(
    services: _RunServices, stack: ExitStack, say: Callable[[str], None], max_restarts: int
) -> Optional[WorkerKeeper]:
    """A keeper that starts a league's lost cluster workers again (`harness.keeper`), when
    any is placed on a cluster; stopped before the services."""
    config = services.config
    placed = [
        KeptWorker(f"worker{i}", spec, service)
        for i, (spec, service) in enumerate(zip(config.workers, services.workers))
        if isinstance(service, PlacedService)
    ]
    if not placed or services.cluster is None:
        return None
    call = config.timeouts.call
    keeper = WorkerKeeper(
        services.cluster,
        stack.enter_context(
            OrchestratorClient(services.orch_url, token=services.token, timeout=call)
        ),
        placed,
        say,
        token=services.token,
        max_restarts=max_restarts,
        startup_timeout=config.timeouts.startup,
        on_spawn=services.kept,
    )
    stack.callback(keeper.stop)
    keeper.start()
    return keeper


def _results(
    config: RunConfig,
    run_dir: Path,
    episodes: list[dict],
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
    write_episodes(run_dir, episodes)
    returns = [e["return"] for e in episodes]
    results = {
        "name": config.name,
        "episodes_file": EPISODES,
        "episode_count": len(episodes),
        "episode_mean_return": round(float(np.mean(returns)), 6) if returns else None,
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


_Kept = TypeVar("_Kept", Progress, GameProgress)


@dataclass
class _Sequence:
    """The MISTK sequence over a run's started services: `run` returns results.json's
    episodes, the training progress and what game training and evaluation add to the
    results ("evals", "evaluation"; a league's "league"). `evaluator`: a solo league's (its
    players are evaluated there). `local_dirs`: the data dirs of agents this harness can
    reach (it started them on this machine); `mirror`: where checkpoints are copied
    (`Checkpoints`), and restored from on resume."""

    config: RunConfig
    env: dict
    orch: OrchestratorClient
    agents: dict[str, AgentClient]
    agent_urls: dict[str, str]
    run_dir: Path
    say: Callable[[str], None]
    resume: Optional[Progress | GameProgress]
    quiet: bool
    evaluate_only: bool = False
    evaluator: Optional[Evaluator] = None
    local_dirs: dict[str, Path] = field(default_factory=dict)
    mirror: Optional[Path] = None

    def run(self) -> tuple[list[dict], Optional[Progress], dict]:
        """Set up, then evaluate, train or play the episode blocks, then evaluate at the
        end, then collect the episodes and take the services down."""
        episodes_before = self.resume.episodes if self.resume else []  # (train moves it on)
        self._set_up()
        outcome: dict = {}
        progress = self._main(outcome)
        if self.config.evaluation is not None and not self.evaluate_only:
            self._evaluate_at_the_end(outcome)
        with _step("getResults"):
            episodes = run_episodes(self.orch, episodes_before)
        self._close()
        return episodes, progress, outcome

    def _set_up(self) -> None:
        """initialize the orchestrator; initialize, build and register every agent."""
        call_timeout = self.config.timeouts.call
        with _step("orchestrator initialize"):
            self.orch.initialize(self.env, agents_needed=len(self.agents), timeout=call_timeout)
        for spec in self.config.agents:
            agent = self.agents[spec.name]
            with _step(f"agent {spec.name} initialize"):
                agent.initialize(spec.properties, spec.hyperparameters, timeout=call_timeout)
            with _step(f"agent {spec.name} buildModel"):
                agent.build_model(self._model(spec, agent), timeout=call_timeout)
            with _step(f"registerAgent {spec.name}"):
                self.orch.register_agent(
                    spec.name,
                    self.agent_urls[spec.name],
                    skip_train=not spec.train,
                    seats=spec.seats,
                    local_inference=spec.local_inference is not None,
                )

    def _model(self, spec: AgentSpec, agent: AgentClient) -> Optional[str]:
        """What the agent builds its model from: a resumed run's checkpoint (restored
        from the mirror first, on a cluster), an evaluation's saved model, else its
        model_path."""
        checkpoint = self.resume.checkpoints.get(spec.name) if self.resume else None
        if checkpoint and self.mirror is not None and spec.target:
            restore_checkpoint(agent, self.mirror, spec.name, checkpoint, self.config.timeouts.call)
        if self.evaluate_only:
            checkpoint = (
                spec.model_path
                or saved_model(spec, self.local_dirs)
                or last_checkpoint(self.config, spec, self.run_dir, self.local_dirs)
            )
            if spec.target:
                self.say(
                    f"agent {spec.name}: "
                    + (
                        f"the model in {checkpoint}"
                        if checkpoint
                        else "untrained (no model_path, and no model saved in the run dir)"
                    )
                )
        return checkpoint or spec.model_path

    def _main(self, outcome: dict) -> Optional[Progress]:
        """The run's work: an evaluation, game training, training or the episode blocks."""
        config = self.config
        if self.evaluate_only:
            with _step("evaluation"):
                outcome["evaluation"] = self._evaluation()
        elif config.game_training is not None:
            assert config.evaluation is not None  # (`RunConfig._check`: game training has one)
            with _step("game training"):
                outcome["evals"] = train_games(
                    self.orch,
                    config.game_training,
                    config.evaluation,
                    self.run_dir,
                    config.timeouts.episodes,
                    self.say,
                    self._checkpoints(config.game_training.checkpoints),
                    quiet=self.quiet,
                    progress=self._resumed(GameProgress),
                    title=config.name,
                )
        elif config.training is not None:
            return self._train(outcome)
        else:
            _play_blocks(config, self.orch, self.say)
        return None

    def _evaluation(self) -> dict[str, Any]:
        """`mistk-rl eval`: the config's game evaluation, else its training's greedy
        episodes on the evaluation seeds."""
        config = self.config
        if config.evaluation is not None:
            return evaluate(self.orch, config.evaluation, config.timeouts.episodes)
        assert config.training is not None  # (`_save_config` refuses a config with neither)
        return asdict(evaluate_returns(self.orch, config.training, config.timeouts.episodes))

    def _resumed(self, kind: type[_Kept]) -> Optional[_Kept]:
        """The progress this run resumes from (None: a new run), of the kind its training
        keeps (`_progress_kind` loaded it)."""
        assert self.resume is None or isinstance(self.resume, kind)
        return self.resume

    def _checkpoints(self, every: Any) -> Optional[Checkpoints]:
        """Checkpoints kept as the config says (pruned where this harness can reach them)."""
        if not every:
            return None
        return Checkpoints(
            self.agents, every, self.local_dirs, self.config.timeouts.call, self.mirror
        )

    def _train(self, outcome: dict) -> Progress:
        """Single-agent training, or a solo league's (`harness.league`) with its results."""
        config, training = self.config, self.config.training
        assert training is not None
        checkpoints = self._checkpoints(training.checkpoints)
        with _step("training"):
            if self.evaluator is not None:
                progress = train_solo_league(
                    self.orch,
                    self.evaluator,
                    training,
                    self.run_dir,
                    config.timeouts.episodes,
                    self.say,
                    checkpoints,
                    self._resumed(Progress),
                    quiet=self.quiet,
                    title=config.name,
                )
            else:
                settings = {a.name: s for a in config.agents if (s := a.settings()) is not None}
                progress = train(
                    self.orch,
                    training,
                    self.run_dir,
                    config.timeouts.episodes,
                    self.say,
                    checkpoints,
                    self._resumed(Progress),
                    quiet=self.quiet,
                    title=config.name,
                    agents=settings,
                )
        if self.evaluator is not None:
            with _step("league results"):
                outcome["league"] = self.orch.get_league().model_dump()
        return progress

    def _evaluate_at_the_end(self, outcome: dict) -> None:
        """The config's evaluation after training: a game league's results, game
        training's last evaluation, or an evaluation run now."""
        config = self.config
        assert config.evaluation is not None
        if config.game_training is not None and config.orchestrator.env.league is not None:
            with _step("league results"):
                kept = outcome["evals"][-1].get("checkpoint") if outcome["evals"] else None
                where = self.local_dirs.get(config.evaluation.agent)
                outcome.update(
                    league_results(
                        self.orch,
                        outcome["evals"],
                        self.run_dir,
                        kept and (where / kept if where else Path(kept)),
                        title=f"{config.name} (seed {config.game_training.seed})",
                    )
                )
        elif config.game_training is not None:  # its last evaluation is the final one
            outcome["evaluation"] = outcome["evals"][-1]["evaluation"]
        else:
            with _step("evaluation"):
                outcome["evaluation"] = evaluate(
                    self.orch, config.evaluation, config.timeouts.episodes
                )

    def _close(self) -> None:
        """Save the models the config asks for; reset and terminate every service."""
        call_timeout = self.config.timeouts.call
        for spec in self.config.agents:
            if spec.save_path and not self.evaluate_only:
                with _step(f"agent {spec.name} saveModel"):
                    self.agents[spec.name].save_model(spec.save_path, timeout=call_timeout)
        with _step("reset"):
            self.orch.reset(timeout=call_timeout)  # resets the registered agents too
            if self.evaluator is not None:
                self.evaluator.client.reset(reset_agents=False, timeout=call_timeout)
                self.evaluator.client.terminate()
            for agent in self.agents.values():
                agent.terminate()
            self.orch.terminate()


def saved_model(spec: AgentSpec, local_dirs: dict[str, Path]) -> Optional[str]:
    """The save_path a run left for this agent, if the harness started it here and the file
    is there."""
    where = local_dirs.get(spec.name)
    if spec.save_path and where is not None and (where / spec.save_path).exists():
        return spec.save_path
    return None


def last_checkpoint(
    config: RunConfig, spec: AgentSpec, run_dir: Path, local_dirs: dict[str, Path]
) -> Optional[str]:
    """The checkpoint of the agent's last evaluation in the run's progress.json (a game
    run's or a gym run's, as `config` says), if the harness started the agent here and the
    file is there."""
    where = local_dirs.get(spec.name)
    try:
        checkpoint = _progress_kind(config).load(run_dir).checkpoints.get(spec.name)
    except (RunConfigError, TypeError):  # (no progress.json; one of another kind of run)
        return None
    if checkpoint and where is not None and (where / checkpoint).exists():
        return checkpoint
    return None


def _url(service: str | ServiceProcess | PlacedService) -> str:
    """A service's URL: given in the config, or where it was started."""
    return service if isinstance(service, str) else service.url


def _default_evaluator(config: RunConfig) -> ServiceSpec:
    """A solo league's evaluator when the config names none: started as its first worker
    is (a gym orchestrator), or the gym orchestrator."""
    first = config.workers[0] if config.workers else None
    if first is not None and first.target:
        return ServiceSpec(**first.model_dump(exclude={"url"}))
    return ServiceSpec(target="orchestrators.gym_orchestrator:GymOrchestrator")


def data_dir(run_dir: Path, name: str) -> Path:
    """The data dir of a service the harness starts (a resumed run starts it on the same)."""
    return run_dir / "data" / name


def _play_blocks(config: RunConfig, orch: OrchestratorClient, say: Callable[[str], None]) -> None:
    printed = 0

    def show_new_episodes(status: Status) -> None:
        """Print each episode as it finishes (the wait's long-polls bring the news)."""
        nonlocal printed
        if status.payload.get("episodesDone", 0) > printed:
            for episode in orch.get_results(since=printed).episodes:
                say(
                    f"  episode {episode.episode:4d}  agent {episode.agent}  "
                    f"return {episode.return_:9.2f}  length {episode.length}"
                )
                printed += 1

    assert config.episodes is not None  # (`RunConfig._check`: one block by default)
    for i, block in enumerate(config.episodes):
        episode_config = EpisodeConfig(
            num_episodes=block.num_episodes,
            seed=block.seed,
            max_steps=block.max_steps,
            train=block.train,
        )
        with _step(f"episode block {i} startEpisode"):
            orch.start_episode(
                episode_config,
                wait=True,
                timeout=config.timeouts.episodes,
                on_status=show_new_episodes,
            )
        if block.save_path:
            with _step(f"episode block {i} saveEpisode"):
                orch.save_episode(block.save_path)
        with _step(f"episode block {i} stopEpisode"):
            orch.stop_episode()


class _step:
    """Turn any service error inside a step into a HarnessError naming the step."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, _exc_type: object, exc: Optional[BaseException], _tb: object
    ) -> Literal[False]:
        if exc is not None and isinstance(exc, ServiceError):
            raise HarnessError(f"{self.name} failed: {exc}") from exc
        return False


def _stop(service: ServiceProcess | PlacedService, say: Callable[[str], None]) -> None:
    code = service.stop()
    if code not in (0, -15, None):
        say(f"{service.role} at {service.url} exited with code {code}; log: {service.log_path}")


def main() -> int:  # python -m harness.run CONFIG
    return run_from_file(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
