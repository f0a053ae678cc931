"""A league's workers on a cluster, started again elsewhere when they are lost.

While a league runs on a Ray cluster, `WorkerKeeper` looks at its placed workers every
second. A worker that is gone (its node was lost, its service died) is started again where
Ray finds its resources, and joins the league in its place (``POST /league/workers`` with
``replaces``): the league drops the job that was running on the lost one and goes on. Each
worker is started again at most `max_restarts` times; one that cannot be placed within the
start-up timeout is left out (the league goes on with the others, or ends naming them).

Only workers are kept here: the league orchestrator, the agents and an evaluator hold the
run's state, so losing one of them fails the run, which `harness.run.run_restarting`
resumes from its last checkpoint.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from harness.config import ServiceSpec
from mistk_rl.deploy.cluster import Cluster, PlacedService, Resources
from mistk_rl.deploy.launch import ServiceStartError
from mistk_rl.sdk.client import OrchestratorClient, ServiceError

POLL_S = 1.0  # how often the workers are looked at


@dataclass
class KeptWorker:
    """One worker of the league, as started (`spec`, `args`) and where it runs now."""

    name: str
    spec: ServiceSpec
    service: PlacedService
    restarts: int = 0
    given_up: bool = False
    was: list[dict[str, str]] = field(default_factory=list)  # earlier {url, node}


class WorkerKeeper:
    """Starts lost workers again (module doc) until `stop`. `on_spawn(name, service)` is
    called for each service it starts, before it waits for it (so the run stops it too)."""

    def __init__(
        self,
        cluster: Cluster,
        league: OrchestratorClient,
        workers: list[KeptWorker],
        say: Callable[[str], None],
        *,
        token: Optional[str],
        max_restarts: int,
        startup_timeout: float,
        on_spawn: Callable[[str, PlacedService], None],
    ) -> None:
        self.cluster, self.league, self.workers, self.say = cluster, league, workers, say
        self.token, self.max_restarts = token, max_restarts
        self.startup_timeout, self.on_spawn = startup_timeout, on_spawn
        self.replaced: list[PlacedService] = []  # lost workers with a successor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="worker-keeper", daemon=True)

    def start(self) -> "WorkerKeeper":
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop looking (before the run stops its services: a stopped worker is not lost)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def placement(self) -> dict[str, dict]:
        """results.json's placement of each worker: where it runs now, and where it ran."""
        return {
            w.name: {
                "url": w.service.url,
                "node": w.service.node_id,
                **({"was": list(w.was)} if w.was else {}),
            }
            for w in self.workers
        }

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            for worker in self.workers:
                if self._stop.is_set():
                    return
                if not worker.given_up and not worker.service.alive():
                    self._replace(worker)

    def _replace(self, worker: KeptWorker) -> None:
        lost = worker.service
        what = f"worker {worker.name} at {lost.url} (node {lost.node_id[:12]}) is lost"
        if worker.restarts >= self.max_restarts:
            worker.given_up = True
            self.say(
                f"{what}; not started again: {worker.restarts} restarts so far, "
                f"--max-restarts {self.max_restarts}"
            )
            return
        worker.restarts += 1
        spec = worker.spec
        assert spec.target is not None  # (it was placed on the cluster: started from a target)
        allow = tuple(
            arg for host in self.cluster.node_addresses() for arg in ("--allow-agent-host", host)
        )
        service = self.cluster.spawn(
            "orchestrator",
            f"{worker.name}.{worker.restarts}",
            spec.target,
            token=self.token,
            extra_args=(*spec.args, *allow),
            resources=Resources(spec.cpus, spec.gpus, spec.resources),
        )
        self.on_spawn(f"{worker.name}.{worker.restarts}", service)
        try:
            service.wait_ready(self.startup_timeout)
            self.league.add_league_worker(service.url, replaces=lost.url)
        except (ServiceStartError, ServiceError) as exc:
            worker.given_up = True
            self.say(f"{what}; it could not be started again: {exc}")
            return
        worker.was.append({"url": lost.url, "node": lost.node_id})
        worker.service = service
        self.replaced.append(lost)
        lost.kill()  # (its actor, if Ray still has it)
        self.say(
            f"{what}: started again at {service.url} on node {service.node_id[:12]}; "
            "it takes the lost one's place in the league"
        )
