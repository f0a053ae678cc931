"""The services of one run and the SDK's clients on them: started here as processes or on
the Ray cluster the config names (or given by URL), waited for, and stopped when the run's
`ExitStack` closes, also on failure; a league's placed workers kept (`harness.keeper`).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Optional

from harness.config import RunConfig, ServiceSpec
from harness.dashboard.view import SERVICES
from harness.keeper import KeptWorker, WorkerKeeper
from harness.league import Evaluator
from harness.sequence import HarnessError
from mistk_rl.deploy.cluster import Cluster, PlacedService, Resources
from mistk_rl.deploy.launch import ServiceProcess, ServiceStartError, spawn_service
from mistk_rl.files import atomic_write_json
from mistk_rl.sdk.client import AgentClient, OrchestratorClient


class RunServices:
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
        self._write_services()

    def _write_services(self) -> None:
        """``services.json``: every service of the run, its role and URL (what a
        dashboard, `mistk-rl dashboard RUN_DIR`, scrapes)."""
        services = {"orchestrator": {"role": "orchestrator", "url": self.orch_url}}
        for i, worker in enumerate(self.workers):
            services[f"worker{i}"] = {"role": "orchestrator", "url": _url(worker)}
        if self.evaluator_url is not None:
            services["evaluator"] = {"role": "orchestrator", "url": self.evaluator_url}
        for name, url in self.agent_urls.items():
            services[name] = {"role": "agent", "url": url}
        atomic_write_json(self.run_dir / SERVICES, services)

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


class RunClients:
    """The SDK's clients on a run's services, closed when `stack` closes."""

    def __init__(
        self, config: RunConfig, services: RunServices, stack: ExitStack, token: Optional[str]
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


def keep_workers(
    services: RunServices, stack: ExitStack, say: Callable[[str], None], max_restarts: int
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


def _stop(service: ServiceProcess | PlacedService, say: Callable[[str], None]) -> None:
    code = service.stop()
    if code not in (0, -15, None):
        say(f"{service.role} at {service.url} exited with code {code}; log: {service.log_path}")
