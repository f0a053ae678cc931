"""The orchestrator's side of the gymnasium bridge: one `OrchestratorSession` owns what a
bridged env needs and everything it started.

Opening it starts what the settings ask for (the orchestrator, a game's opponents: child
services on loopback ports, `mistk_rl.deploy.launch`), serves the bridge's own agent
(`RelayAgent` on a thread, `gymnasium_loopback`), initializes the orchestrator with the env
spec and registers the agents. `start_run` starts an episode run (one startEpisode of
`episode_budget` episodes on `num_envs` copies) and returns its first action request;
`exchange` answers a request and returns the next news. A seeded run of a game seat
sets everything up again first (an orchestrator reset, then initialize and registrations), so
the opponents' random streams restart from their own seeds and a seed replays its games.
Every wait is bounded, and while one goes on the services are watched: a service that
exits, fails or stops answering raises `BridgeError` naming it within about
`timeouts.health_every` seconds. `close` stops the run and everything started, and leaves
no process and no thread.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import numpy as np

from mistk_rl.bridges.gymnasium_loopback import LoopbackAgent
from mistk_rl.bridges.gymnasium_relay import Ask, BridgeError, Ended, Handoff, News, RelayAgent
from mistk_rl.bridges.gymnasium_settings import BridgeSettings
from mistk_rl.deploy.launch import ServiceProcess, spawn_service, wait_ready
from mistk_rl.sdk.client import AgentClient, OrchestratorClient, ServiceError

log = logging.getLogger(__name__)
T = TypeVar("T")
# the orchestrator's states once a run is over (by itself, by a stop, by a failure)
RUN_OVER = ("completed_episode", "ready", "failed")


class BridgeTimeout(BridgeError, TimeoutError):
    """A wait of the bridge ran out; the message names what did not answer."""


def _calling(what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call`, its service error as a `BridgeError` naming the step."""
    try:
        return call(*args, **kwargs)
    except ServiceError as exc:
        raise BridgeError(f"{what}: {exc}") from exc


class OrchestratorSession:
    """An orchestrator's env copies, driven through the bridge's agent (module doc)."""

    def __init__(self, settings: BridgeSettings) -> None:
        self.settings = settings
        self.handoff = Handoff(settings.timeouts.answer)
        self.relay = RelayAgent(self.handoff)
        self._work = tempfile.TemporaryDirectory(prefix="mistk-rl-bridge-")
        self._started: list[ServiceProcess] = []
        self._clients: dict[str, AgentClient] = {}  # by agent name
        self._agent_urls: dict[str, str] = {}
        self._loopback: Optional[LoopbackAgent] = None
        self.orch: Optional[OrchestratorClient] = None
        self.url = settings.url or ""  # the orchestrator's root URL (once started)
        self._running = False  # a run is on whose end (`Ended`) the caller has not seen
        self._closed = False
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    # ---- opening -----------------------------------------------------------------------
    def _open(self) -> None:
        s = self.settings
        url = s.url or self._start("orchestrator", s.target, s.orchestrator_args(), s.token)
        self._agent_urls = {
            o.name: o.url or self._start("agent", o.target or "", [], None) for o in s.opponents
        }
        for service in self._started:  # (spawned side by side, now each waited for)
            wait_ready(service, s.timeouts.start)
        self.url = url  # (the root: the client's base_url has the base path too)
        self.orch = OrchestratorClient(url, token=s.token, timeout=s.timeouts.call)
        self._loopback = LoopbackAgent(self.relay, ready_timeout=s.timeouts.start)
        self._agent_urls[s.agent_name] = self._loopback.url
        self._set_up()
        if self.relay.observation_space is None or self.relay.action_space is None:
            raise BridgeError(f"the orchestrator at {url} registered the agent without spaces")
        self.observation_space = self.relay.observation_space
        self.action_space = self.relay.action_space

    def _set_up(self) -> None:
        """initialize the orchestrator with the env; set up and register every agent."""
        assert self.orch is not None
        s = self.settings
        _calling(
            f"initialize the orchestrator at {self._url()} with env {s.env}",
            self.orch.initialize,
            s.env,
            agents_needed=1 + len(s.opponents),
            timeout=s.timeouts.call,
        )
        self._set_up_agent(s.agent_name, (s.seat,) if s.seat else (), {}, {}, skip_train=False)
        for o in s.opponents:
            self._set_up_agent(o.name, o.seats, o.properties, o.hyperparameters, skip_train=True)

    def _start(self, role: str, target: str, args: list[str], token: Optional[str]) -> str:
        name = f"{role}{len(self._started)}"
        work = Path(self._work.name)
        service = spawn_service(
            role,
            target,
            data_dir=work / name,
            log_path=work / f"{name}.log",
            token=token,
            extra_args=args,
        )
        self._started.append(service)
        return service.url

    def _set_up_agent(
        self,
        name: str,
        seats: tuple[str, ...],
        properties: dict[str, Any],
        hyperparameters: dict[str, Any],
        skip_train: bool,
    ) -> None:
        """initialize, buildModel and registerAgent, each error naming the agent."""
        assert self.orch is not None
        timeout, url = self.settings.timeouts.call, self._agent_urls[name]
        if name not in self._clients:
            self._clients[name] = AgentClient(url, timeout=timeout)
        client = self._clients[name]
        # (an orchestrator's reset keeps its agents' settings: they are initialized)
        if _calling(f"agent {name} at {url}: status", client.status).state != "initialized":
            _calling(
                f"agent {name} at {url}: initialize",
                client.initialize,
                properties,
                hyperparameters,
                timeout=timeout,
            )
        _calling(f"agent {name} at {url}: buildModel", client.build_model, None, timeout=timeout)
        _calling(
            f"registerAgent {name} ({url}) with the orchestrator at {self._url()}",
            self.orch.register_agent,
            name,
            url,
            skip_train=skip_train,
            seats=seats or None,
        )

    # ---- runs ----------------------------------------------------------------------------
    def start_run(self, seed: Optional[int] = None) -> Ask:
        """A new episode run (after stopping the one going on): every copy is reset, copy i
        with ``seed + i`` when a seed is given. Its first action request."""
        assert self.orch is not None
        self.stop_run()
        s = self.settings
        if seed is not None and s.opponents:
            self._set_up_again()
        self.handoff.clear()
        config: dict[str, Any] = {
            **s.episode,
            "numEpisodes": s.episode_budget,
            "numEnvs": s.num_envs,
            "train": True,
        }
        if seed is not None:
            config["seed"] = seed
        _calling(f"startEpisode {config} on {self._url()}", self.orch.start_episode, config)
        self._running = True
        news = self.next_news("the first action request of an episode run")
        if not isinstance(news, Ask):
            raise BridgeError(
                f"the orchestrator at {self._url()} ended the episode run it just "
                "started without asking for an action"
            )
        return news

    def _set_up_again(self) -> None:
        """Reset the orchestrator and its agents, then set everything up as at the start: a
        seeded reset of a game seat restarts the opponents' random streams from their
        seeds too (they live in the opponents, which only a set-up seeds), so the same
        seed plays the same games."""
        assert self.orch is not None
        _calling(
            f"reset the orchestrator at {self._url()}",
            self.orch.reset,
            timeout=self.settings.timeouts.call,
        )
        self._set_up()

    def exchange(self, actions: np.ndarray) -> News:
        """Answer the request waiting with `actions` (a row each); the next news."""
        self.handoff.answer(actions)
        return self.next_news("the next action request")

    def next_news(self, waiting_for: str) -> News:
        """The next action request, or the run's end; `BridgeError` when a service went
        away or failed, `BridgeTimeout` after `timeouts.step` seconds."""
        t = self.settings.timeouts
        deadline = time.monotonic() + t.step
        while True:
            news = self.handoff.take(max(0.0, min(t.health_every, deadline - time.monotonic())))
            if news is None:
                news = self._check_health(waiting_for)
            if isinstance(news, Ended):
                self._run_over()
            if news is not None:
                return news
            if time.monotonic() >= deadline:
                raise BridgeTimeout(
                    f"the orchestrator at {self._url()} sent no {waiting_for} within "
                    f"{t.step} s (timeouts.step); its state: {self._state()}"
                )

    def _check_health(self, waiting_for: str) -> Optional[News]:
        """Raise `BridgeError` when a service the run needs is gone or failed; the news that
        came meanwhile, if any."""
        for service in self._started:
            if not service.alive():
                raise BridgeError(
                    f"the {service.role} {service.target} at {service.url} exited with code "
                    f"{service.process.returncode} while the bridge waited for {waiting_for};"
                    f" its log ends:\n{service.log_tail(15)}"
                )
        if self._loopback is not None and not self._loopback.alive():
            raise BridgeError(f"the bridge's own agent service stopped (waiting for {waiting_for})")
        assert self.orch is not None
        try:
            status = self.orch.status()
        except ServiceError as exc:
            raise BridgeError(
                f"the orchestrator at {self._url()} does not answer while the bridge waits "
                f"for {waiting_for}: {exc}"
            ) from exc
        if status.state == "failed":
            raise BridgeError(f"the orchestrator at {self._url()} failed: {status.reason}")
        if status.state != "running":
            news = self.handoff.take(0.0)  # (the end may have come since the last look)
            if news is None:
                raise BridgeError(
                    f"the orchestrator at {self._url()} is '{status.state}', not running, "
                    f"and sent no {waiting_for}"
                )
            return news
        return None

    def _run_over(self) -> None:
        """The run ended (`Ended`): wait until the orchestrator says how, and raise if it
        failed."""
        assert self.orch is not None
        self._running = False
        status = _calling(
            "the orchestrator's state after its episode run",
            self.orch.wait_for_state,
            RUN_OVER,
            self.settings.timeouts.call,
        )
        if status.state == "failed":
            raise BridgeError(f"the orchestrator at {self._url()} failed: {status.reason}")

    def stop_run(self) -> None:
        """Stop the run going on (its requests are answered at once meanwhile, so the
        orchestrator gets to see the stop) and wait until the orchestrator is ready."""
        assert self.orch is not None
        timeout = self.settings.timeouts.call
        state = _calling("the orchestrator's state", self.orch.status).state
        if state == "failed":
            raise BridgeError(
                f"the orchestrator at {self._url()} failed: {self.orch.status().reason}"
            )
        if state not in ("running", "completed_episode") and not self._running:
            return
        self.handoff.drain(True)
        try:
            if state in ("running", "completed_episode"):
                _calling("stopEpisode", self.orch.stop_episode)
            if self._running:  # (its episodeStopped: then no request of it is left)
                self._await_end(timeout)
            _calling("the orchestrator back to ready", self.orch.wait_for_state, "ready", timeout)
        finally:
            self.handoff.drain(self._closed)  # (once closing, nothing waits for the caller)
            self._running = False

    def _await_end(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not isinstance(self.handoff.take(max(0.0, deadline - time.monotonic())), Ended):
            if time.monotonic() >= deadline:
                raise BridgeTimeout(
                    f"the orchestrator at {self._url()} did not end its episode run within "
                    f"{timeout} s of stopEpisode"
                )

    def _url(self) -> str:
        return self.url or "(not started)"

    def _state(self) -> str:
        if self.orch is None:
            return "unknown (no orchestrator)"
        try:
            return self.orch.status().state
        except ServiceError as exc:
            return f"unknown ({exc})"

    # ---- closing -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the run, reset an orchestrator that was running already (it is left as it
        was found), stop what was started, stop serving the agent. Idempotent; never
        raises (what went wrong is logged)."""
        if self._closed:
            return
        self._closed = True
        self.handoff.drain(True)  # (nothing waits for the caller from now on)
        if self.orch is not None and self._loopback is not None:
            self._quietly("stopping the episode run", self.stop_run)
        if self.orch is not None and self.settings.url:
            self._quietly(
                "resetting the orchestrator",
                lambda: self.orch.reset(timeout=self.settings.timeouts.call),  # type: ignore[union-attr]
            )
        for service in self._started:
            service.begin_stop()
        for service in self._started:
            self._quietly(f"stopping {service.role} {service.target}", service.stop)
        for client in self._clients.values():
            client.close()
        if self.orch is not None:
            self.orch.close()
        if self._loopback is not None:
            left = self._loopback.close()
            if left:
                log.warning("gymnasium bridge: %s did not stop", left)
        self._work.cleanup()

    @staticmethod
    def _quietly(what: str, call: Callable[[], Any]) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - close goes on; the caller is told in the log
            log.warning("gymnasium bridge: %s: %s", what, exc)
