"""Services placed on a Ray cluster: the same `mistk-rl serve`, started by a Ray actor.

A service on a cluster is one small Ray actor (`ServiceHost`) that asks Ray for the service's
resources (CPUs, GPUs, custom node resources: what pins a service to a kind of node) and, on
the node Ray picked, starts the service exactly as on one machine (`mistk_rl.deploy.launch`:
`mistk-rl serve` on a free port, bound to the node's address, its data dir on that node).
Callers get its URL and talk to it over plain HTTP as always: Ray places services, it is not
on the step path. The actor is the service's parent: when the actor dies (its node is lost,
`ray.kill`), the service gets SIGTERM (`launch.end_with_parent`).

Ray is an extra (``pip install 'mistk-rl[ray]'``) and is imported only by `Cluster`, so
nothing on one machine imports it.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from mistk_rl.deploy.launch import ServiceStartError, spawn_service, wait_ready
from mistk_rl.rl.envs.ray_address import unreachable

NAMESPACE = "mistk-rl"
PLACEMENT_POLL_S = 1.0  # how often a service waiting to be placed checks the cluster's nodes
UNPLACEABLE_GRACE_S = 5.0  # how long a request no live node can hold waits for one to join


class ClusterError(RuntimeError):
    """Ray is not installed, or no cluster answers at the address; the message says which."""


@dataclass(frozen=True)
class Resources:
    """What one service asks of its node: Ray reserves it for the service's lifetime."""

    cpus: float = 1.0
    gpus: float = 0.0
    custom: Mapping[str, float] = field(default_factory=dict)  # e.g. {"game_node": 1}

    def options(self) -> dict[str, Any]:
        """The actor's Ray options."""
        return {"num_cpus": self.cpus, "num_gpus": self.gpus, "resources": dict(self.custom)}

    def __str__(self) -> str:
        parts = [f"{self.cpus:g} CPU"] + ([f"{self.gpus:g} GPU"] if self.gpus else [])
        return ", ".join(parts + [f"{v:g} {k}" for k, v in sorted(self.custom.items())])


def default_data_root() -> Path:
    """Where services keep their data dirs on a node: its temp dir."""
    return Path(tempfile.gettempdir()) / "mistk-rl"


class ServiceHost:
    """The Ray actor behind one service (made remote by `Cluster`; this body runs on the
    service's node). Its constructor starts the service without waiting for it, so the
    services of a run boot side by side; `ready` waits."""

    def __init__(
        self,
        role: str,
        target: str,
        name: str,
        run_id: str,
        data_root: Optional[str],
        token: Optional[str],
        extra_args: Sequence[str],
    ) -> None:
        import ray

        context = ray.get_runtime_context()
        self.node_id = context.get_node_id()
        root = Path(data_root) if data_root else default_data_root()
        self.data_dir = root / run_id / name
        # (RAY_ADDRESS: the service can use the cluster too, e.g. envManager ray's actors)
        self.service = spawn_service(
            role,
            target,
            data_dir=self.data_dir,
            log_path=root / run_id / "logs" / f"{name}.log",
            token=token,
            host=ray.util.get_node_ip_address(),
            extra_args=tuple(extra_args),
            env={**os.environ, "RAY_ADDRESS": context.gcs_address},
        )

    def ready(self, timeout: float) -> dict[str, Any]:
        """Wait until the service answers; where it is (ServiceStartError with its log
        tail when it exits or does not answer in time)."""
        wait_ready(self.service, timeout)
        return {
            "url": self.service.url,
            "node_id": self.node_id,
            "data_dir": str(self.data_dir),
            "pid": self.service.process.pid,
        }

    def alive(self) -> bool:
        return self.service.alive()

    def log_tail(self, lines: int = 30) -> str:
        return self.service.log_tail(lines)

    def stop(self, timeout: float = 10.0) -> Optional[int]:
        return self.service.stop(timeout)


@dataclass
class PlacedService:
    """A service on the cluster, as the harness sees it: the interface of
    `mistk_rl.deploy.launch.ServiceProcess` (url, wait_ready, begin_stop, stop, log_tail)."""

    role: str
    target: str
    name: str
    resources: Resources
    actor: Any
    url: str = ""
    node_id: str = ""
    data_dir: str = ""  # on the service's node
    _stopping: Any = None

    @property
    def log_path(self) -> str:
        """Where its log is: on its node (`ServiceHost`), beside the data dirs."""
        return f"{Path(self.data_dir).parent / 'logs' / self.name}.log on node {self.node_id[:12]}"

    def wait_ready(self, timeout: float) -> None:
        """Wait until Ray placed the service and it answers; ServiceStartError naming the
        service (and what it asked for, when it could not be placed) otherwise, after
        removing its actor."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        ready = self.actor.ready.remote(timeout)
        deadline = time.monotonic() + timeout
        unplaceable_since: Optional[float] = None
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    info = ray.get(ready, timeout=max(0.01, min(PLACEMENT_POLL_S, left)))
                    break
                except GetTimeoutError:
                    if left <= PLACEMENT_POLL_S:
                        raise
                # a request that no live node could ever hold fails now, not at the timeout
                # (a node that joins within the grace still takes it)
                if _fits_a_node(self.resources):
                    unplaceable_since = None
                elif unplaceable_since is None:
                    unplaceable_since = time.monotonic()
                elif time.monotonic() - unplaceable_since >= UNPLACEABLE_GRACE_S:
                    self.kill()
                    raise ServiceStartError(
                        f"{self.role} {self.name!r} was not placed: no live node of the "
                        f"cluster has what it asks for ({self.resources}); the nodes have "
                        f"{_node_totals()}"
                    )
        except GetTimeoutError:
            self.kill()
            raise ServiceStartError(
                f"{self.role} {self.name!r} was not placed and answering within {timeout} s: "
                f"it asks for {self.resources}; the cluster has "
                f"{_free(ray.available_resources())} free"
            ) from None
        except RayTaskError as exc:
            self.kill()
            raise ServiceStartError(str(exc.cause) if exc.cause else str(exc)) from None
        except RayActorError as exc:
            self.kill()
            raise ServiceStartError(
                f"{self.role} {self.name!r}: its Ray actor died ({exc})"
            ) from None
        self.url, self.node_id, self.data_dir = info["url"], info["node_id"], info["data_dir"]

    def alive(self) -> bool:
        import ray

        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=10))
        except Exception:  # noqa: BLE001 - an actor that cannot answer is not alive
            return False

    def log_tail(self, lines: int = 30) -> str:
        import ray

        try:
            return ray.get(self.actor.log_tail.remote(lines), timeout=10)
        except Exception as exc:  # noqa: BLE001 - the node may be gone with the log
            return f"(no log: {type(exc).__name__})"

    def begin_stop(self) -> None:
        if self._stopping is None:
            self._stopping = self.actor.stop.remote()

    def stop(self, timeout: float = 10.0) -> Optional[int]:
        """Stop the service (SIGTERM, then SIGKILL, on its node) and remove its actor;
        returns the service's exit code (None when its node did not answer)."""
        import ray

        self.begin_stop()
        try:
            code = ray.get(self._stopping, timeout=timeout + 5)
        except Exception:  # noqa: BLE001 - the actor or its node is gone: nothing to stop
            code = None
        self.kill()
        return code

    def kill(self, timeout: float = 10.0) -> None:
        """Remove the service's actor and wait, up to `timeout`, until it is gone.

        `ray.kill` only asks the cluster to end the actor: right after it, Ray still lists
        the actor's name now and then (2 times in 40 on a one-node cluster). A call made on
        the actor fails once Ray has ended it, so the wait is that call failing."""
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
            ray.get(self.actor.__ray_ready__.remote(), timeout=timeout)
        except Exception:  # noqa: BLE001 - the call failing is the wait's end (or: gone
            pass  # before the kill; its node not answering, which ends the actor with it)


def _asked(resources: Resources) -> dict[str, float]:
    """What `resources` asks of one node, in Ray's resource names."""
    asked = {"CPU": resources.cpus, "GPU": resources.gpus, **resources.custom}
    return {k: v for k, v in asked.items() if v > 0}


def _fits_a_node(resources: Resources) -> bool:
    """Whether some live node has, in all, what `resources` asks for (free or not)."""
    import ray

    asked = _asked(resources)
    return any(
        all(node["Resources"].get(k, 0.0) >= v for k, v in asked.items())
        for node in ray.nodes()
        if node["Alive"]
    )


def _node_totals() -> str:
    import ray

    alive = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    return "; ".join(f"[{_free(totals)}]" for totals in alive) or "no live node"


def _free(available: Mapping[str, float]) -> str:
    shown = {
        k: v
        for k, v in available.items()
        if not k.startswith(("node:", "memory", "object_store_memory"))
    }
    return ", ".join(f"{v:g} {k}" for k, v in sorted(shown.items())) or "nothing"


def _no_cluster(address: str, cause: BaseException | str) -> ClusterError:
    return ClusterError(
        f"no Ray cluster at {address!r} ({cause}); start one with "
        "'ray start --head', or use --cluster local"
    )


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse at once an address where no cluster answers (`ray_address.unreachable`): Ray
    would retry connecting to it for minutes."""
    why = unreachable(address, timeout)
    if why is not None:
        raise _no_cluster(address, why)


class Cluster:
    """A connection to a Ray cluster that places services for one run.

    `address`: ``auto`` joins the cluster running on this machine (``ray start --head``, or
    a node of it); ``HOST:PORT`` or ``ray://HOST:PORT`` one elsewhere; ``local`` starts a
    private one-node cluster for this run (to try it out)."""

    def __init__(self, address: str, run_id: str, data_root: Optional[str] = None) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ClusterError(
                "placing services on a cluster needs Ray: pip install 'mistk-rl[ray]'"
            ) from exc
        self.run_id, self.data_root = run_id, data_root
        self._owns = not ray.is_initialized()
        if self._owns:
            _check_reachable(address)
            try:
                ray.init(
                    address=address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    configure_logging=False,
                    include_dashboard=False,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise _no_cluster(address, exc) from exc
        self._host = ray.remote(max_restarts=0)(ServiceHost)

    def spawn(
        self,
        role: str,
        name: str,
        target: str,
        *,
        token: Optional[str] = None,
        extra_args: Sequence[str] = (),
        resources: Resources = Resources(),
        near_driver: bool = False,
    ) -> PlacedService:
        """Ask Ray for a node with `resources` and start the service there (without
        waiting: `PlacedService.wait_ready`). `near_driver`: on this process's node when it
        has the resources free, else wherever Ray finds them (a soft node affinity)."""
        options = resources.options()
        if near_driver:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            # (soft alone waits while the node is busy; spilling goes elsewhere then too.
            # The flag is Ray's own, underscored: the pinned Ray has it, a test checks it)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self.driver_node_id(), soft=True, _spill_on_unavailable=True
            )
        actor = self._host.options(name=f"{self.run_id}/{name}", **options).remote(
            role, target, name, self.run_id, self.data_root, token, list(extra_args)
        )
        return PlacedService(role, target, name, resources, actor)

    def driver_node_id(self) -> str:
        """The node this process (`mistk-rl run`, the Ray driver) is attached to."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def node_addresses(self) -> list[str]:
        """The addresses of the cluster's live nodes."""
        import ray

        return sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})

    def close(self) -> None:
        """Disconnect (and stop the cluster, if this run started it: ``local``)."""
        import ray

        if self._owns and ray.is_initialized():
            ray.shutdown()
