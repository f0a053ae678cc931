"""The orchestrator service's handlers (`OrchestratorService`): registering agents (their
URLs checked), episodes, results, and the league's endpoints."""

from __future__ import annotations

import ipaddress
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Protocol, runtime_checkable
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel

from mistk_rl import API_VERSION
from mistk_rl.errors import IllegalState, InvalidRequest, ResourceNotFound
from mistk_rl.framework.orchestrator import AbstractOrchestrator, RegisteredAgent
from mistk_rl.lifecycle import AGENT, ORCHESTRATOR, Lifecycle
from mistk_rl.limits import Limits
from mistk_rl.registry import suggest
from mistk_rl.sdk.client import (
    AgentClient,
    Conflict,
    IncompatibleService,
    ServiceError,
    ServiceUnavailable,
)
from mistk_rl.sdk.stepping import prepare_local_inference
from mistk_rl.service.handlers.common import JSON, Response, ServiceBase
from mistk_rl.wire.jsonable import to_jsonable

log = logging.getLogger(__name__)


@runtime_checkable
class _LeagueHost(Protocol):
    """An orchestrator that workers join (`LeagueOrchestrator`): addLeagueWorker's."""

    scheduler: Optional[Any]  # None until the league is initialized

    def add_worker(self, url: str, replaces: Optional[str] = None) -> dict[str, Any]: ...


class OrchestratorService(ServiceBase):
    role = "orchestrator"

    def __init__(
        self,
        orchestrator: AbstractOrchestrator,
        data_dir: Path,
        *,
        agent_token: Optional[str] = None,
        allowed_agent_hosts: Iterable[str] = (),
        agent_timeout: float = 20.0,
        env_modules: Iterable[str] = (),
        limits: Limits = Limits(),
        shares: Optional[dict[str, Path]] = None,
    ) -> None:
        super().__init__(orchestrator, Lifecycle(ORCHESTRATOR), data_dir, limits, shares)
        self.orchestrator = orchestrator
        self.agent_token = agent_token
        self.allowed_agent_hosts = {h.lower() for h in allowed_agent_hosts}
        self.agent_timeout = agent_timeout
        orchestrator.env_modules = frozenset(env_modules)

    def initialize(self, body: dict[str, Any]) -> Response:
        given = refuse_unknown_options(
            body["env"], self.orchestrator.env_settings, "env", type(self.orchestrator).__name__
        )
        env = {"kwargs": {}, **given}
        agents_needed = body.get("agentsNeeded", 1)
        self.orchestrator.validate_initialize(env, agents_needed)

        def hook() -> None:
            self.orchestrator.agents_needed = agents_needed
            self.orchestrator.results.clear()
            self.orchestrator.env_steps = 0
            self.orchestrator.do_initialize(env, agents_needed)

        return self._accepted("initialize", hook)

    def registerAgent(  # noqa: N802
        self,
        agent_name: str,
        agent_url: str,
        skip_train: bool = False,
        seats: Optional[str] = None,
        local_inference: bool = False,
    ) -> Response:
        self._check_agent_url(agent_url)
        if agent_name in self.orchestrator.agents:
            raise InvalidRequest(f"an agent named {agent_name!r} is registered already")
        if local_inference and not self.orchestrator.local_inference:
            raise InvalidRequest(
                f"localInference: {type(self.orchestrator).__name__} does not run policy copies"
            )
        # the agent is asked before the trigger fires, so a refusal changes nothing here
        # (not even resourceVersion); `run` checks the state again, atomically
        self.lifecycle.check("register_agent")
        held = self.orchestrator.validate_register_agent(
            agent_name, tuple(seats.split(",")) if seats else (), skip_train
        )
        client = AgentClient(agent_url, token=self.agent_token, timeout=self.agent_timeout)
        try:
            capabilities = self._handshake(
                client, agent_name, agent_url, skip_train, held, local_inference
            )
        except BaseException:
            client.close()
            raise

        def hook() -> None:
            self.orchestrator.agents[agent_name] = RegisteredAgent(
                agent_name, agent_url, skip_train, client, capabilities, held
            )
            if local_inference:
                prepare_local_inference()
            self.orchestrator.do_register_agent(agent_name, agent_url, skip_train)

        def facts() -> dict[str, bool]:
            registered = len(self.orchestrator.agents) >= self.orchestrator.agents_needed
            return {"all_agents_registered": registered}

        self.lifecycle.run("register_agent", hook, facts=facts)
        return self._done()

    def startEpisode(self, body: dict[str, Any]) -> Response:  # noqa: N802
        model = self.orchestrator.episode_settings
        body = refuse_unknown_options(body, model, "startEpisode", type(self.orchestrator).__name__)
        try:
            config = model.model_validate(body)
        except ValueError as exc:
            raise InvalidRequest(f"invalid episode config: {exc}") from exc
        self.limits.check("max_envs", config.num_envs, "numEnvs")
        self.lifecycle.check("start_episode")  # the checks below read the env and agents
        self.orchestrator.validate_agent_settings(config)
        self.orchestrator.validate_start_episode(config)
        return self._accepted("start_episode", lambda: self.orchestrator.do_start_episode(config))

    def saveEpisode(self, path: str) -> Response:  # noqa: N802
        target = self._path(path)
        self.lifecycle.run("save_episode", lambda: self.orchestrator.do_save_episode(target))
        return self._done()

    def stopEpisode(self) -> Response:  # noqa: N802
        self.lifecycle.run("stop_episode", self.orchestrator.do_stop_episode)
        return self._done()

    def getResults(self, since: int = 0, limit: Optional[int] = None) -> Response:  # noqa: N802
        return (
            {
                "episodes": self.orchestrator.results.read(since, limit),
                **self.orchestrator.extra_results(),
            },
            200,
            JSON,
        )

    def getLeague(self) -> Response:  # noqa: N802
        league = self.orchestrator.league_view()
        if league is None:
            raise ResourceNotFound(
                f"{type(self.orchestrator).__name__} runs no league"
                + (" (initialize it first)" if hasattr(self.orchestrator, "manager") else "")
            )
        return to_jsonable(league), 200, JSON

    def addLeagueWorker(self, body: dict[str, Any]) -> Response:  # noqa: N802
        league = self.orchestrator
        if not isinstance(league, _LeagueHost):
            raise ResourceNotFound(
                f"{type(self.orchestrator).__name__} runs no league: no workers to join"
            )
        _service_url(body["url"], "url")
        if body.get("replaces") is not None:
            _service_url(body["replaces"], "replaces")
        if league.scheduler is None:
            raise IllegalState(
                "addLeagueWorker",
                self.lifecycle.state,
                self.lifecycle.allowed_api(),
                detail="addLeagueWorker: the league is not initialized: "
                "initialize it (with its first workers) first",
            )
        return to_jsonable(league.add_worker(body["url"], body.get("replaces"))), 202, JSON

    def reset(self, reset_agents: bool = True) -> Response:
        def hook() -> None:
            self.orchestrator.do_reset()
            if reset_agents:
                errors = self._reset_agents()
            else:  # let go of them as they are: they may be playing elsewhere
                errors = []
                for agent in self.orchestrator.agents.values():
                    agent.client.close()
            self.orchestrator.agents.clear()
            self.orchestrator.results.clear()
            self.orchestrator.env_steps = 0
            if errors:
                log.warning("orchestrator reset: %s", "; ".join(errors))

        return self._accepted("reset", hook)

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

    def _handshake(
        self,
        client: AgentClient,
        name: str,
        url: str,
        skip_train: bool,
        seats: tuple[str, ...],
        local_inference: bool = False,
    ) -> frozenset[str]:
        """Tell the agent it is registered; returns its capabilities. Whatever answers at
        `url` is remote content: only status codes and our own words go back to the caller
        (echoing a body would let a caller read any loopback server through us)."""
        where = f"agent {name!r} at {url}"
        try:
            version = client.api_version()
        except ServiceUnavailable as exc:
            raise InvalidRequest(f"{where} cannot be reached: {exc}") from exc
        except IncompatibleService as exc:
            raise InvalidRequest(
                f"{where} speaks contract {exc.version}, this orchestrator {API_VERSION}: "
                "a different major version"
            ) from exc
        except (ServiceError, ValueError) as exc:
            raise InvalidRequest(
                f"{where} does not answer apiVersion as a mistk-rl agent ({_what_answered(exc)})"
            ) from exc
        if version.role != "agent":
            raise InvalidRequest(f"{where} is a mistk-rl {version.role}, not an agent")
        if local_inference and "local" not in version.capabilities:
            raise InvalidRequest(
                f"localInference: {where} offers no policy copy (it does "
                "not list the capability 'local')"
            )
        config = {
            "name": name,
            "train": not skip_train,
            **self.orchestrator.agent_config(name, seats),
        }
        try:
            client.agent_registered(config)
        except Conflict as exc:
            agent_state = exc.state if exc.state in AGENT.states else "unknown"
            error = IllegalState(
                "registerAgent",
                self.lifecycle.state,
                self.lifecycle.allowed_api(),
                detail=f"{where} cannot be registered in its state "
                f"'{agent_state}': initialize it (and buildModel) "
                "or reset it first",
            )
            error.extra["agentState"] = agent_state
            raise error from exc
        except (ServiceError, ValueError) as exc:
            log.warning("registerAgent: %s refused: %s", where, exc)
            raise InvalidRequest(
                f"{where} refused registration ({_what_answered(exc)}); "
                "its answer is in this orchestrator's log"
            ) from exc
        return frozenset(version.capabilities)

    def _check_agent_url(self, url: str) -> None:
        hostname = _service_url(url).hostname
        assert hostname  # (`_service_url` refuses a URL without one)
        host = hostname.lower()
        if host in self.allowed_agent_hosts or host == "localhost":
            return
        try:
            if ipaddress.ip_address(host).is_loopback:
                return
        except ValueError:
            pass
        raise InvalidRequest(
            f"agentUrl host {host!r} is not allowed: use a loopback address "
            "or start the orchestrator with --allow-agent-host "
            f"{host}",
            field="agentUrl",
        )


_NETLOC = re.compile(r"(?:[^@]*@)?(?:\[[^\[\]]*\]|[^\[\]:@]*)(?::[^@]*)?")


def _service_url(url: str, field: str = "agentUrl") -> SplitResult:
    """`url` (a service's base URL) split, or InvalidRequest naming `field` and what is wrong
    with it: every way
    urllib refuses a URL (an unclosed '[', an invalid IPv6 address, characters that change
    under NFKC normalization, a bad port), and what it takes without a word but no URL
    holds (whitespace and control characters, which urllib silently drops; text around a
    bracketed host: 'http://[::1]x/' parses as host ::1)."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise InvalidRequest(
            f"{field} {url!r} is not a valid URL: it holds whitespace or a control character",
            field=field,
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidRequest(f"{field} {url!r} is not a valid URL: {exc}", field=field) from exc
    try:
        parts.port  # noqa: B018 - parsing the port raises on ':99999' or ':abc'
    except ValueError as exc:
        raise InvalidRequest(f"{field} {url!r} has an invalid port: {exc}", field=field) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"{field} {url!r} is not an http(s) URL", field=field)
    if not _NETLOC.fullmatch(parts.netloc):
        raise InvalidRequest(
            f"{field} {url!r} is not a valid URL: its host part {parts.netloc!r} is malformed",
            field=field,
        )
    return parts


def _what_answered(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return f"it answered HTTP {status}" if status else "its answer is not a mistk-rl one"


def refuse_unknown_options(
    given: dict[str, Any], model: type[BaseModel], what: str, owner: str
) -> dict[str, Any]:
    """`given` without its nulls (the spec's nullable options: "not set"); 400 naming the
    first other key that `model` (an orchestrator's settings) does not take: another
    orchestrator's option, or a misspelling (with a suggestion)."""
    known = [f.alias or name for name, f in model.model_fields.items()]
    for key, value in given.items():
        if key not in known and value is not None:
            raise InvalidRequest(
                f"{what}: {key!r} is not an option of {owner} (its "
                f"options: {', '.join(known)}){suggest(key, known)}"
            )
    return {key: value for key, value in given.items() if value is not None}
