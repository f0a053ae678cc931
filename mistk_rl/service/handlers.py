"""Operation handlers: one method per operationId in the spec, bound to one implementation.

A handler turns the validated request into the implementation's terms (numpy arrays, paths
inside the data dir), checks what the spec cannot (so bad input is refused before any state
change), and hands the hook to the `Lifecycle`, which fires the triggers. They are plain
methods, so tests can drive a service in-process without HTTP.
"""
from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Any, Iterable, Optional
from urllib.parse import urlsplit

import numpy as np

from mistk_rl import API_VERSION
from mistk_rl.agent import AbstractAgent, EpisodeInfo, ReplayBatch
from mistk_rl.client import AgentClient, ServiceError
from mistk_rl.codec import StackedMap
from mistk_rl.errors import InvalidRequest, Rejected
from mistk_rl.files import resolve_in
from mistk_rl.jsonable import to_jsonable
from mistk_rl.lifecycle import AGENT, ORCHESTRATOR, Lifecycle
from mistk_rl.orchestrator import AbstractOrchestrator, RegisteredAgent
from mistk_rl.schemas import EpisodeConfig
from mistk_rl.spaces import space_from_dict

log = logging.getLogger(__name__)
Response = tuple[dict[str, Any], int, dict[str, str]]
JSON = {"Content-Type": "application/json"}  # the spec also lists problem+json: be explicit
MAX_LONG_POLL_S = 60.0


class _Service:
    """What both roles share: status (with long-poll), apiVersion, terminate, data paths."""

    role = ""

    def __init__(self, impl: Any, lifecycle: Lifecycle, data_dir: Path) -> None:
        self.impl = impl
        self.lifecycle = lifecycle
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        impl.data_dir = self.data_dir
        impl._lifecycle = lifecycle

    def status(self, resource_version: Optional[int] = None,
               timeout: float = 30.0) -> Response:
        if resource_version is None:
            return self.lifecycle.status(), 200, JSON
        return self.lifecycle.wait(resource_version, min(timeout, MAX_LONG_POLL_S)), 200, JSON

    capabilities: tuple[str, ...] = ()

    def apiVersion(self) -> Response:  # noqa: N802 - named by the spec's operationId
        return {"version": API_VERSION, "role": self.role,
                "capabilities": list(self.capabilities)}, 200, JSON

    def terminate(self) -> Response:
        self.lifecycle.run("terminate", self.impl.do_terminate)
        return self._done()

    def _path(self, path: str) -> Path:
        return resolve_in(self.data_dir, path)

    def _done(self) -> Response:
        return self.lifecycle.status(), 200, JSON


def _arrays(values: dict[str, Any]) -> dict[str, np.ndarray]:
    """entity -> array. The binary encoding's rows are views into the request body: they are
    copied (once per field) so an agent that keeps them (a replay buffer) does not keep every
    request body alive with them."""
    if isinstance(values, StackedMap):
        return dict(zip(values, values.array.copy()))
    return {key: np.asarray(value) for key, value in values.items()}


def _entities(obs: dict[str, Any]) -> dict[str, Any]:
    if not obs:
        raise InvalidRequest("obs is empty: give one observation per entity")
    return obs


def _replay_batch(body: dict[str, Any]) -> ReplayBatch:
    """A replay body as arrays, after checking every field names the same entities."""
    entities = set(body["actions"])
    for key in ("prevObs", "rewards", "newObs", "terminated"):
        if set(body[key]) != entities:
            raise InvalidRequest(f"{key} names entities {sorted(body[key])}, "
                                 f"actions names {sorted(entities)}")
    return ReplayBatch(prev_obs=_arrays(body["prevObs"]), actions=_arrays(body["actions"]),
                       rewards=dict(body["rewards"]), new_obs=_arrays(body["newObs"]),
                       terminated=dict(body["terminated"]),
                       truncated={k: body.get("truncated", {}).get(k, False) for k in entities})


class AgentService(_Service):
    role = "agent"
    capabilities = ("step", "tensors")  # tensors: the binary encoding on the step path

    def __init__(self, agent: AbstractAgent, data_dir: Path) -> None:
        super().__init__(agent, Lifecycle(AGENT), data_dir)
        self.agent = agent
        self._initialized = False

    def initialize(self, body: dict[str, Any]) -> Response:
        props, hparams = body.get("modelProperties", {}), body.get("hyperparameters", {})
        self.agent.validate_initialize(props, hparams)

        def hook() -> None:
            self.agent.do_initialize(props, hparams)
            self._initialized = True
        return self.lifecycle.run("initialize", hook), 202, JSON

    def buildModel(self, model_path: Optional[str] = None) -> Response:  # noqa: N802
        path = self._path(model_path) if model_path else None
        if path is not None and not path.exists():
            raise InvalidRequest(f"modelPath {model_path!r} does not exist in the data dir")
        accepted = self.lifecycle.run("build_model", lambda: self.agent.do_build_model(path))
        return accepted, 202, JSON

    def saveModel(self, model_path: str) -> Response:  # noqa: N802
        path = self._path(model_path)
        accepted = self.lifecycle.run("save_model", lambda: self.agent.do_save_model(path))
        return accepted, 202, JSON

    def agentRegistered(self, body: dict[str, Any]) -> Response:  # noqa: N802
        try:
            obs_space = (space_from_dict(body["observationSpace"])
                         if "observationSpace" in body else None)
            act_space = space_from_dict(body["actionSpace"]) if "actionSpace" in body else None
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidRequest(f"invalid space: {exc}") from exc

        def hook() -> None:
            self.agent.name = body["name"]
            self.agent.observation_space, self.agent.action_space = obs_space, act_space
            self.agent.train = body.get("train", True)
            self.agent.do_agent_registered(body)
        self.lifecycle.run("agent_registered", hook)
        return self._done()

    def episodeStarted(self, body: dict[str, Any]) -> Response:  # noqa: N802
        info = EpisodeInfo(obs=_arrays(body["obs"]), mode=body.get("mode", "collect"),
                           episode=body.get("episode"),
                           action_mask=_arrays(body["actionMask"]) if "actionMask" in body
                           else None)
        self.lifecycle.run("episode_started", lambda: self.agent.do_episode_started(info))
        return self._done()

    def getAction(self, body: dict[str, Any]) -> Response:  # noqa: N802
        obs = _arrays(_entities(body["obs"]))
        mask = _arrays(body["actionMask"]) if body.get("actionMask") else None
        actions = self.lifecycle.run("get_action", lambda: self.agent.do_get_action(obs, mask))
        return {"actions": to_jsonable(actions)}, 200, JSON

    def replayAction(self, body: dict[str, Any]) -> Response:  # noqa: N802
        batch = _replay_batch(body)
        self.lifecycle.run("replay_action", lambda: self.agent.do_replay_action(batch))
        return self._done()

    def step(self, body: dict[str, Any]) -> Response:
        batch = _replay_batch(body["replay"]) if body.get("replay") else None
        obs = _arrays(_entities(body["obs"]))
        mask = _arrays(body["actionMask"]) if body.get("actionMask") else None

        def hook() -> Any:
            if batch is not None:
                self.agent.do_replay_action(batch)
            return self.agent.do_get_action(obs, mask)
        return {"actions": to_jsonable(self.lifecycle.run("step", hook))}, 200, JSON

    def episodeStopped(self) -> Response:  # noqa: N802
        self.lifecycle.run("episode_stopped", self.agent.do_episode_stopped)
        return self._done()

    def reset(self, unload_model: bool = True) -> Response:
        def hook() -> None:
            self.agent.do_reset(unload_model)
            self._initialized = self._initialized and not unload_model

        def facts() -> dict[str, bool]:
            return {"keep_model": self._initialized}
        return self.lifecycle.run("reset", hook, facts=facts), 202, JSON


class OrchestratorService(_Service):
    role = "orchestrator"

    def __init__(self, orchestrator: AbstractOrchestrator, data_dir: Path, *,
                 agent_token: Optional[str] = None, allowed_agent_hosts: Iterable[str] = (),
                 agent_timeout: float = 30.0) -> None:
        super().__init__(orchestrator, Lifecycle(ORCHESTRATOR), data_dir)
        self.orchestrator = orchestrator
        self.agent_token = agent_token
        self.allowed_agent_hosts = {h.lower() for h in allowed_agent_hosts}
        self.agent_timeout = agent_timeout

    def initialize(self, body: dict[str, Any]) -> Response:
        env = {"id": body["env"]["id"], "kwargs": body["env"].get("kwargs", {})}
        agents_needed = body.get("agentsNeeded", 1)
        self.orchestrator.validate_initialize(env, agents_needed)

        def hook() -> None:
            self.orchestrator.agents_needed = agents_needed
            self.orchestrator.results = []
            self.orchestrator.env_steps = 0
            self.orchestrator.do_initialize(env, agents_needed)
        return self.lifecycle.run("initialize", hook), 202, JSON

    def registerAgent(self, agent_name: str, agent_url: str,  # noqa: N802
                      skip_train: bool = False) -> Response:
        self._check_agent_url(agent_url)
        if agent_name in self.orchestrator.agents:
            raise InvalidRequest(f"an agent named {agent_name!r} is registered already")

        def hook() -> None:
            client = AgentClient(agent_url, token=self.agent_token, timeout=self.agent_timeout)
            config = {"name": agent_name, "train": not skip_train,
                      **self.orchestrator.agent_config(agent_name)}
            try:
                client.agent_registered(config)
                capabilities = frozenset(client.api_version().capabilities)
            except ServiceError as exc:
                client.close()
                status = 409 if exc.status == 409 else 400
                raise Rejected(f"agent {agent_name!r} at {agent_url} refused registration: "
                               f"{exc.detail}", status=status) from exc
            self.orchestrator.agents[agent_name] = RegisteredAgent(
                agent_name, agent_url, skip_train, client, capabilities)
            self.orchestrator.do_register_agent(agent_name, agent_url, skip_train)

        def facts() -> dict[str, bool]:
            registered = len(self.orchestrator.agents) >= self.orchestrator.agents_needed
            return {"all_agents_registered": registered}
        self.lifecycle.run("register_agent", hook, facts=facts)
        return self._done()

    def startEpisode(self, body: dict[str, Any]) -> Response:  # noqa: N802
        config = EpisodeConfig.model_validate(body)
        accepted = self.lifecycle.run("start_episode",
                                      lambda: self.orchestrator.do_start_episode(config))
        return accepted, 202, JSON

    def saveEpisode(self, path: str) -> Response:  # noqa: N802
        target = self._path(path)
        self.lifecycle.run("save_episode", lambda: self.orchestrator.do_save_episode(target))
        return self._done()

    def stopEpisode(self) -> Response:  # noqa: N802
        self.lifecycle.run("stop_episode", self.orchestrator.do_stop_episode)
        return self._done()

    def getResults(self) -> Response:  # noqa: N802
        return {"episodes": list(self.orchestrator.results)}, 200, JSON

    def reset(self) -> Response:
        def hook() -> None:
            self.orchestrator.do_reset()
            errors = self._reset_agents()
            self.orchestrator.agents.clear()
            self.orchestrator.results = []
            self.orchestrator.env_steps = 0
            if errors:
                log.warning("orchestrator reset: %s", "; ".join(errors))
        return self.lifecycle.run("reset", hook), 202, JSON

    def terminate(self) -> Response:
        def hook() -> None:
            try:
                self.orchestrator.do_terminate()
            finally:
                for agent in self.orchestrator.agents.values():
                    agent.client.close()
        self.lifecycle.run("terminate", hook)
        return self._done()

    def _reset_agents(self) -> list[str]:
        """Reset every registered agent (keeping its model); report, don't raise, failures."""
        errors = []
        for agent in self.orchestrator.agents.values():
            try:
                agent.client.reset(unload_model=False, timeout=self.agent_timeout)
            except ServiceError as exc:
                errors.append(f"agent {agent.name!r}: {exc}")
            finally:
                agent.client.close()
        return errors

    def _check_agent_url(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequest(f"agentUrl {url!r} is not an http(s) URL")
        host = parts.hostname.lower()
        if host in self.allowed_agent_hosts or host == "localhost":
            return
        try:
            if ipaddress.ip_address(host).is_loopback:
                return
        except ValueError:
            pass
        raise InvalidRequest(f"agentUrl host {host!r} is not allowed: use a loopback address "
                             "or start the orchestrator with --allow-agent-host "
                             f"{host}")
