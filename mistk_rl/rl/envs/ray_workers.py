"""`RayEnvManager`: each env copy in a Ray actor, placed anywhere on the cluster.

The subprocess manager's workers, with Ray as the process keeper: an orchestrator on one
node steps env copies on several (a simulator that needs a node of its own, or more env
copies than one machine holds). Each copy is a small actor (`EnvActor`) that runs the same
step as a subprocess worker (`worker.step_env`: the episode resets in the actor, so an
episode's end costs no extra round trip) and asks its node for `cpus` and custom
`resources` (what pins env copies to a kind of node). Supervision is the same as the
subprocess manager's: a copy whose env raises, whose actor dies (its node is lost, it was
killed) or that does not answer within `step_timeout` is killed, started again where Ray
finds room, reset with its next seed and reported by an abnormal timestep; `max_retry`
failures in a row retire it.

The process that runs the manager must reach the cluster: `address` (default: the
``RAY_ADDRESS`` a service placed by `mistk_rl.deploy.cluster` gets, else ``auto``). Ray is imported
only when this manager is launched.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from mistk_rl.rl.envs.base import EnvManager, Timestep
from mistk_rl.rl.envs.ray_address import unreachable
from mistk_rl.rl.envs.worker import step_env


def join_cluster(address: Optional[str] = None) -> Any:
    """The `ray` module, connected to the cluster at `address` (default: ``RAY_ADDRESS``,
    else the cluster of this machine) once per process; RuntimeError saying why not (Ray not
    installed, no cluster there)."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("env copies on Ray need Ray: pip install 'mistk-rl[ray]'") from exc
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or "auto"
        why = unreachable(address)  # (ray.init would retry for minutes)
        if why is not None:
            raise RuntimeError(f"no Ray cluster at {address!r} for the env copies: {why}")
        try:
            ray.init(
                address=address,
                log_to_driver=False,
                configure_logging=False,
                include_dashboard=False,
            )
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise RuntimeError(f"no Ray cluster at {address!r} for the env copies: {exc}") from exc
    return ray


class EnvActor:
    """One env copy, in a Ray actor (made remote by `RayEnvManager`)."""

    def __init__(self, env_fn: Any) -> None:
        import ray

        self.env = env_fn()
        self.node_id = ray.get_runtime_context().get_node_id()

    def reset(self, seed: Optional[int]) -> tuple[Any, dict]:
        return self.env.reset(seed=seed)

    def step(self, action: Any) -> tuple:
        return step_env(self.env, None, action)

    def node(self) -> str:
        return self.node_id

    def close(self) -> None:
        self.env.close()


class RayEnvManager(EnvManager):
    """Env copies as Ray actors (module doc)."""

    @classmethod
    def default_config(cls) -> dict:
        return {**super().default_config(), "address": None, "cpus": 1.0, "resources": {}}

    def _launch(self) -> None:
        self._ray = ray = join_cluster(self.config["address"])
        self._remote = ray.remote(max_restarts=0)(EnvActor).options(
            num_cpus=self.config["cpus"], resources=dict(self.config["resources"])
        )
        self._actors: list[Any] = [self._remote.remote(fn) for fn in self.env_fns]

    @property
    def nodes(self) -> list[Optional[str]]:
        """The node each env copy's actor runs on (None: it does not answer)."""
        timeout = self.config["reset_timeout"]
        answers = [
            self._gather({i: actor.node.remote()}, timeout)[i]
            if actor is not None
            else ("error", None)
            for i, actor in enumerate(self._actors)
        ]
        return [node if status == "ok" else None for status, node in answers]

    def _reset(
        self, ids: list[int], seeds: dict[int, Optional[int]]
    ) -> dict[int, tuple[Any, dict]]:
        answers = self._gather(
            {i: self._actors[i].reset.remote(seeds.get(i)) for i in ids},
            self.config["reset_timeout"],
        ).items()
        return {
            i: reset
            for i, (status, payload) in answers
            if (reset := self._reset_answered(i, status, payload)) is not None
        }

    def _step(self, actions: dict[int, Any]) -> dict[int, Timestep]:
        answers = self._gather(
            {i: self._actors[i].step.remote(a) for i, a in actions.items()},
            self.config["step_timeout"],
        )
        return {
            i: self._answered(i, payload) if status == "ok" else self._failed(i, payload)
            for i, (status, payload) in answers.items()
        }

    def _gather(self, calls: dict[int, Any], timeout: float) -> dict[int, tuple[str, Any]]:
        """Each call's ("ok", result), or ("error", why): the env raised, its actor died, or
        it gave no answer within `timeout` (hung)."""
        ray = self._ray
        env_of = {ref: i for i, ref in calls.items()}
        done, _ = ray.wait(list(env_of), num_returns=len(env_of), timeout=timeout)
        answers: dict[int, tuple[str, Any]] = {}
        for ref in done:
            answers[env_of[ref]] = _result(ray, ref)
        for i in calls:
            answers.setdefault(i, ("error", f"no answer within {timeout} s (hung)"))
        return answers

    def _restart(self, i: int) -> Optional[tuple[Any, dict]]:
        """A fresh actor for env i (where Ray finds room), reset; None if env i was retired."""
        while not self._give_up(i):
            self._kill(i)
            self._actors[i] = self._remote.remote(self.env_fns[i])
            status, payload = self._gather(
                {i: self._actors[i].reset.remote(self._env_seed(i))}, self.config["reset_timeout"]
            )[i]
            if status == "ok":
                self._last_obs[i] = payload[0]
                return payload
            self._abnormal(i, f"restart failed: {payload}")
        self._kill(i)
        return None

    def _kill(self, i: int) -> None:
        actor, self._actors[i] = self._actors[i], None
        if actor is not None:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone with its node
                pass

    def _close(self) -> None:
        for i in range(len(getattr(self, "_actors", ()))):
            self._kill(i)


def _result(ray: Any, ref: Any) -> tuple[str, Any]:
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return "ok", ray.get(ref)
    except RayTaskError as exc:  # the env raised
        return "error", str(exc.cause) if exc.cause is not None else str(exc)
    except RayActorError as exc:  # the actor (its process or its node) is gone
        return "error", f"the env's actor died ({type(exc).__name__})"
