"""The SDK: typed clients for the agent and orchestrator services.

Every call has a timeout; every error the service answers becomes a typed exception carrying
the problem details; background operations (202) wait for their outcome by long-polling
``GET status`` unless called with ``wait=False``. Connections are kept alive (a small pool
per client, `mistk_rl.sdk.transport`), so a step costs one round trip and no handshake.

    agent = AgentClient("http://127.0.0.1:8081")
    agent.initialize(hyperparameters={"lr": 1e-3})   # waits until 'initialized'
    agent.build_model()
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union
from urllib.parse import urlsplit

import numpy as np

from mistk_rl import API_VERSION, __version__
from mistk_rl.sdk.schemas import (
    AgentConfig,
    AgentInitParams,
    ApiVersion,
    ColumnActions,
    EpisodeConfig,
    EpisodeResult,
    EpisodeSettings,
    EpisodeStart,
    FileWritten,
    League,
    LeagueWorkerJoin,
    Learned,
    OrchestratorInitParams,
    OrchestratorProgress,
    OrchestratorStatus,
    PolicyCopy,
    Problem,
    Replay,
    Results,
    Status,
)
from mistk_rl.sdk.transport import Response, Stream, Transport, TransportError
from mistk_rl.wire import codec, frames
from mistk_rl.wire.jsonable import dumps, loads_fast, to_jsonable
from mistk_rl.wire.step_columns import as_columns, step_body

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
# a wait long-polls in chunks; each may take its chunk plus a grace before the service counts
# as hung, so a service that stops answering is noticed within 25 s of any wait
LONG_POLL_CHUNK = 15.0
LONG_POLL_GRACE = 10.0
INSTANCE_HEADER = "Mistk-Instance"
RESULTS_PAGE = 10_000  # episodes per getResults call of `OrchestratorClient.iter_episodes`


@dataclass
class Played:
    """What one `OrchestratorClient.play` call played: the episodes it added (and, for
    games, the totals and every evaluation so far), and the orchestrator's progress before
    and after, whose counters give what the call moved."""

    results: Results
    before: OrchestratorProgress
    after: OrchestratorProgress

    @property
    def episodes(self) -> list[EpisodeResult]:
        return self.results.episodes

    @property
    def env_steps(self) -> int:
        """Env steps (games: moves) the call took."""
        return self.after.env_steps - self.before.env_steps

    def agent_steps(self, agent: str) -> int:
        """Moves `agent` made in the call (games)."""
        return self.after.agent_steps.get(agent, 0) - self.before.agent_steps.get(agent, 0)


# ---- errors ------------------------------------------------------------------------------
class ServiceError(Exception):
    """The service answered with an error (problem details in `.problem`), or could not be
    reached (`.status` is None)."""

    def __init__(
        self, message: str, status: Optional[int] = None, problem: Optional[Problem] = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem

    @property
    def detail(self) -> str:
        return self.problem.detail if self.problem and self.problem.detail else str(self)


class BadRequest(ServiceError):
    """400: the request was invalid; nothing changed."""


class Unauthorized(ServiceError):
    """401: missing or wrong bearer token."""


class NotFound(ServiceError):
    """404."""


class Conflict(ServiceError):
    """409: illegal in the current state or busy; `.state` and `.allowed` say what is legal."""

    @property
    def state(self) -> Optional[str]:
        return self.problem.state if self.problem else None

    @property
    def allowed(self) -> list[str]:
        return list(self.problem.allowed or []) if self.problem else []


class PayloadTooLarge(ServiceError):
    """413: the body is larger than the service accepts."""


class ServerError(ServiceError):
    """500: an implementation hook raised (the service is now failed) or a bug."""


class ServiceUnavailable(ServiceError):
    """The service could not be reached, or did not answer within the timeout."""


class ServiceFailed(ServiceError):
    """A wait ended because the service entered state 'failed'; `.reason` says why."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"service failed: {status.reason}")
        self.reason = status.reason
        self.service_status = status


class ServiceRestarted(ServiceError):
    """The service answering is not the one this client talked to: it restarted (a new
    worker process) and lost its state. `.previous` and `.current` are the instance ids."""

    def __init__(self, base_url: str, previous: str, current: str) -> None:
        super().__init__(
            f"{base_url} restarted and lost its state (instance {previous} is "
            f"gone, {current} answers): start over from initialize"
        )
        self.previous, self.current = previous, current


class IncompatibleService(ServiceError):
    """The service speaks another major version of the contract than this SDK: what it
    accepts and answers may differ in ways neither side can detect call by call."""

    def __init__(self, base_url: str, version: str) -> None:
        super().__init__(
            f"{base_url} speaks contract {version}; this SDK speaks {API_VERSION} "
            f"(mistk-rl {__version__}): a different major version is not compatible. "
            "Use an SDK of its major version, or upgrade the service"
        )
        self.version = version


class WaitTimeout(ServiceError, TimeoutError):
    """A wait for a state ran out of time; `.last` is the last status seen."""

    def __init__(self, message: str, last: Status) -> None:
        super().__init__(message)
        self.last = last


@dataclass
class _Request:
    """One request, encoded, between `_ServiceClient._request` and `_answer`."""

    method: str
    path: str
    base_url: str
    raw: bool  # answer with the body's bytes as they came
    wire: dict[str, Any]  # Transport.request's keyword arguments

    def unavailable(self, exc: TransportError) -> "ServiceUnavailable":
        timeout = self.wire["timeout"]
        why = f"no answer within {timeout} s" if exc.timed_out else f"cannot connect ({exc})"
        return ServiceUnavailable(f"{self.method} {self.base_url}{self.path}: {why}")


def _loads(raw: bytes) -> Any:
    """An answer's JSON: orjson, else `json` (which also reads a NaN an answer may hold)."""
    try:
        return loads_fast(raw)
    except ValueError:
        return json.loads(raw)


_ERRORS: dict[int, type[ServiceError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


# ---- clients -----------------------------------------------------------------------------
class _ServiceClient:
    base_path = ""

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
        spin: Optional[float] = None,
    ) -> None:
        """`url` is the service's root (``http://host:port``) or its full base path.
        `spin`: seconds to wait for each answer awake before sleeping, while answers come
        that fast (`mistk_rl.sdk.transport`; None: ``MISTK_RL_SPIN_US``, else 1 ms with two
        CPUs or more, 0 with one)."""
        url = url.rstrip("/")
        self.base_url = url if urlsplit(url).path not in ("", "/") else url + self.base_path
        self.timeout = timeout
        self.token = token  # (a league orchestrator calls its workers with its agents' token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.transport = Transport(self.base_url, headers=headers, spin=spin)
        # the service instance this client talks to, from its first answer; an answer from
        # another instance raises ServiceRestarted (set it to None to accept a new one)
        self.instance: Optional[str] = None

    def close(self) -> None:
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing --
    def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        tensors: bool = False,
        columns: bool = False,
        raw: bool = False,
        raw_body: Optional[bytes] = None,
    ) -> Any:
        """One request; with `tensors`, the body and the answer use the binary encoding
        (`columns`: a body of numpy columns, `codec.encode`'s column form). `raw`: the
        answer's bytes as they came (a file); `raw_body`: bytes sent as they are."""
        request = self._request(
            method,
            path,
            json_body=json_body,
            params=params,
            timeout=timeout,
            tensors=tensors,
            columns=columns,
            raw=raw,
            raw_body=raw_body,
        )
        try:
            response = self.transport.request(method, path, **request.wire)
        except TransportError as exc:
            raise request.unavailable(exc) from exc
        return self._answer(request, response)

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        tensors: bool = False,
        columns: bool = False,
        raw: bool = False,
        raw_body: Optional[bytes] = None,
    ) -> "_Request":
        """A request as the transport sends it (`_call`'s arguments)."""
        if params:
            params = {
                k: (str(v).lower() if isinstance(v, bool) else v)
                for k, v in params.items()
                if v is not None
            }
        content_type = accept = "application/json"
        if tensors:
            body = None if json_body is None else codec.encode(json_body, columns=columns)
            content_type = codec.CONTENT_TYPE
            accept = f"{codec.CONTENT_TYPE}, application/json"  # actions come back binary
        elif raw_body is not None:
            body, content_type = raw_body, "application/octet-stream"
        else:
            body = None if json_body is None else dumps(json_body)
        if raw:
            accept = "application/octet-stream, application/problem+json"
        return _Request(
            method,
            path,
            self.base_url,
            raw,
            {
                "body": body,
                "params": params,
                "timeout": timeout or self.timeout,
                "content_type": content_type,
                "accept": accept,
            },
        )

    def _answer(self, request: "_Request", response: Response) -> Any:
        """The answer's body, decoded; a typed ServiceError for a 4xx or 5xx."""
        instance = response.headers.get(INSTANCE_HEADER)
        if instance != self.instance and instance is not None:
            if self.instance is not None:
                raise ServiceRestarted(self.base_url, self.instance, instance)
            self.instance = instance
        if response.status < 400:
            if request.raw:
                return response.body
            if response.headers.get("Content-Type", "").startswith(codec.CONTENT_TYPE):
                return codec.decode(response.body)
            return _loads(response.body) if response.body else None
        try:
            data = _loads(response.body)
            problem = Problem.model_validate(
                {
                    "status": response.status,
                    "title": data.get("title") or response.reason,
                    **{k: v for k, v in data.items() if k not in ("status", "title")},
                }
            )
        except (ValueError, AttributeError):
            problem = Problem(
                status=response.status,
                title=response.reason or "error",
                detail=response.body[:500].decode(errors="replace"),
            )
        cls = _ERRORS.get(response.status, ServerError if response.status >= 500 else ServiceError)
        raise cls(
            f"{request.method} {request.path} -> {response.status} {problem.title}: "
            f"{problem.detail or ''}".rstrip(": "),
            response.status,
            problem,
        )

    def _status_call(self, method: str, path: str, **kw: Any) -> Status:
        return Status.model_validate(self._call(method, path, **kw))

    def _finish(self, accepted: Status, wait: bool, timeout: Optional[float]) -> Status:
        return self.wait_until_done(accepted, timeout) if wait else accepted

    # -- shared operations --
    def status(
        self, resource_version: Optional[int] = None, timeout: Optional[float] = None
    ) -> Status:
        """The status now; with `resource_version`, once it moves past that (long-poll)."""
        params = {"resourceVersion": resource_version, "timeout": timeout}
        http_timeout = (
            self.timeout
            if resource_version is None
            else (timeout or 0) + min(self.timeout, LONG_POLL_GRACE)
        )
        return self._status_call("GET", "/status", params=params, timeout=http_timeout)

    def api_version(self) -> ApiVersion:
        """The contract version, role and capabilities; IncompatibleService when the
        service speaks another major version than this SDK (checked on every call)."""
        answer = ApiVersion.model_validate(self._call("GET", "/apiVersion"))
        if answer.version.split(".")[0] != API_VERSION.split(".")[0]:
            raise IncompatibleService(self.base_url, answer.version)
        return answer

    def terminate(self) -> Status:
        """Release the service's resources; legal in every state."""
        return self._status_call("POST", "/terminate")

    def get_file(self, path: str, timeout: Optional[float] = None) -> bytes:
        """The bytes of a file in the service's data dir (a checkpoint, a snapshot): how
        files move between services that share no file system. NotFound when it is not there."""
        return self._call("GET", "/files", params={"path": path}, timeout=timeout, raw=True)

    def put_file(self, path: str, data: bytes, timeout: Optional[float] = None) -> FileWritten:
        """Write `data` as the file `path` of the service's data dir (atomically); the answer
        has the SHA-256 the service computed from what it received."""
        return FileWritten.model_validate(
            self._call(
                "PUT", "/files", params={"path": path}, timeout=timeout, raw_body=bytes(data)
            )
        )

    def wait_for_state(
        self, states: Union[str, Iterable[str]], timeout: float = 60.0, *, after_version: int = -1
    ) -> Status:
        """Wait (long-poll, no sleeping) until the state is one of `states`.

        Raises ServiceFailed if the service enters 'failed' (unless waited for) and
        WaitTimeout when `timeout` seconds pass.
        """
        wanted = {states} if isinstance(states, str) else set(states)
        return self._wait(
            lambda s: s.state in wanted,
            f"state in {sorted(wanted)}",
            timeout,
            after_version,
            failed_ok="failed" in wanted,
        )

    def wait_until_done(
        self,
        accepted: Status,
        timeout: Optional[float] = None,
        on_status: Optional[Callable[[Status], None]] = None,
    ) -> Status:
        """Wait until the service leaves the busy state a 202 answer showed; `on_status` sees
        every status on the way (progress as the service reports it)."""
        return self._wait(
            lambda s: s.state != accepted.state,
            f"leaving '{accepted.state}'",
            timeout or 600.0,
            accepted.resource_version,
            failed_ok=False,
            on_status=on_status,
        )

    def _wait(
        self,
        done,
        what: str,
        timeout: float,
        after_version: int,
        failed_ok: bool,
        on_status: Optional[Callable[[Status], None]] = None,
    ) -> Status:
        deadline = time.monotonic() + timeout
        status = self.status()
        while True:
            if on_status is not None:
                on_status(status)
            if status.state == "failed" and not failed_ok:
                raise ServiceFailed(status)
            if status.resource_version > after_version and done(status):
                return status
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"{self.base_url}: gave up waiting for {what} after "
                    f"{timeout} s; state is '{status.state}'",
                    status,
                )
            status = self.status(status.resource_version, min(LONG_POLL_CHUNK, remaining))


def _arrays(value: Optional[Mapping[str, Any]]) -> Optional[dict[str, np.ndarray]]:
    """Named arrays (weights) from either encoding (`codec.pack_arrays`)."""
    return None if value is None else codec.unpack_arrays(value)


class AgentClient(_ServiceClient):
    """Client of an agent service (``/v1/mistk/agent``).

    Set `binary` (when the agent lists the ``tensors`` capability) to send getAction,
    replayAction and step in the binary tensor encoding: much cheaper than JSON for many
    entities. Actions then come back as numpy values.
    """

    base_path = "/v1/mistk/agent"
    binary = False

    def initialize(
        self,
        model_properties: Optional[dict] = None,
        hyperparameters: Optional[dict] = None,
        *,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Status:
        body = AgentInitParams(
            model_properties=model_properties or {}, hyperparameters=hyperparameters or {}
        )
        return self._finish(
            self._status_call("POST", "/initialize", json_body=body.wire()), wait, timeout
        )

    def build_model(
        self,
        model_path: Optional[str] = None,
        *,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Status:
        accepted = self._status_call("POST", "/buildModel", params={"modelPath": model_path})
        return self._finish(accepted, wait, timeout)

    def save_model(
        self, model_path: str, *, wait: bool = True, timeout: Optional[float] = None
    ) -> Status:
        accepted = self._status_call("POST", "/saveModel", params={"modelPath": model_path})
        return self._finish(accepted, wait, timeout)

    def agent_registered(self, config: Union[AgentConfig, dict]) -> Status:
        config = AgentConfig.model_validate(config)
        return self._status_call("POST", "/agentRegistered", json_body=config.wire())

    def episode_started(
        self,
        obs: Mapping[str, Any],
        *,
        mode: str = "collect",
        action_mask: Optional[Mapping[str, Any]] = None,
        episode: Optional[int] = None,
        epsilon: Optional[float] = None,
    ) -> Status:
        body = EpisodeStart(
            obs=to_jsonable(obs),
            mode=mode,
            episode=episode,
            epsilon=epsilon,
            action_mask=to_jsonable(action_mask) if action_mask else None,
        )
        return self._status_call("POST", "/episodeStarted", json_body=body.wire())

    def get_action(
        self, obs: Mapping[str, Any], action_mask: Optional[Mapping[str, Any]] = None
    ) -> dict[str, Any]:
        """Actions keyed by entity for observations keyed by entity (numpy or lists)."""
        body: dict[str, Any] = {"obs": obs}
        if action_mask:
            body["actionMask"] = action_mask
        return self._call("POST", "/getAction", json_body=body, tensors=self.binary)["actions"]

    def replay_action(self, replay: Union[Replay, dict]) -> Status:
        # hot path: no pydantic for dicts, the service validates against the spec
        body = replay.wire() if isinstance(replay, Replay) else replay
        return Status.model_validate(
            self._call("POST", "/replayAction", json_body=body, tensors=self.binary)
        )

    def step(
        self,
        obs: Mapping[str, Any],
        *,
        replay: Union[Replay, dict, None] = None,
        action_mask: Optional[Mapping[str, Any]] = None,
    ) -> dict[str, Any]:
        """replayAction (when `replay` is given) then getAction, in one round trip."""
        body: dict[str, Any] = {"obs": obs}
        if replay:
            body["replay"] = replay.wire() if isinstance(replay, Replay) else replay
        if action_mask:
            body["actionMask"] = action_mask
        return self._call("POST", "/step", json_body=body, tensors=self.binary)["actions"]

    def step_columns(
        self,
        envs: Any,
        obs: Any,
        *,
        action_mask: Any = None,
        step_ids: Any = None,
        rewards: Any = None,
        terminated: Any = None,
        truncated: Any = None,
        act: Any = None,
        reset: Optional[Mapping[str, Any]] = None,
        **reported: Any,
    ) -> ColumnActions:
        """The columnar step (`stepColumns`, capability ``columns``): row i of each column is
        env copy ``envs[i]``. Report earlier steps' outcomes by their `step_ids` (-1: none)
        with `rewards`, `terminated` and `truncated`, `obs` being what each step led to;
        `reset` ({rows, obs, actionMask}) gives the observations that rows whose episode
        ended act on; `act` (bool per row) leaves rows that only report. Returns the
        actions and step ids of the acting rows, in row order. Columns are numpy arrays
        (or lists); a Dict observation space's `obs` is a dict of columns. `reported`: any
        further field a step reports (`mistk_rl.wire.step_columns.REPORTED`)."""
        return self.post_step(
            step_body(
                envs,
                obs,
                action_mask=action_mask,
                step_ids=step_ids,
                rewards=rewards,
                terminated=terminated,
                truncated=truncated,
                act=act,
                reset=reset,
                **reported,
            )
        )

    def post_step(self, body: Mapping[str, Any]) -> ColumnActions:
        """stepColumns with a body as `mistk_rl.wire.step_columns.step_body` builds it."""
        return _column_actions(
            self._call("POST", "/stepColumns", json_body=body, tensors=self.binary, columns=True)
        )

    def column_pipeline(self, stream: bool = False) -> "ColumnPipeline":
        """stepColumns requests sent ahead of their answers, on a connection of their own
        (`ColumnPipeline`); with `stream`, as frames on the agent's step stream."""
        return ColumnPipeline(self, stream)

    def step_stream(self) -> "ColumnPipeline":
        """stepColumns on the agent's step stream (``GET stepStream`` upgraded, capability
        ``stream``, `mistk_rl.wire.frames`): `send` and `receive` carry the same bodies and
        answers as `step_columns`, without HTTP per step; `close` ends it."""
        return ColumnPipeline(self, stream=True)

    def get_policy(self, weights: bool = True) -> PolicyCopy:
        """A copy of the agent's policy to act with locally (`getPolicy`, capability
        ``local``): its name, config and, with `weights`, the acting model's weights (name
        -> numpy array). `mistk_rl.sdk.stepping.LocalStepper` builds and uses it."""
        answer = self._call(
            "GET", "/policy", params={"weights": weights}, tensors=self.binary, columns=True
        )
        arrays = _arrays(answer.pop("weights", None))
        copy = PolicyCopy.model_validate(answer)
        copy.weights = arrays  # (arrays: not validated as a model field)
        return copy

    def replay_columns(
        self,
        envs: Any,
        obs: Any,
        actions: Any,
        rewards: Any,
        next_obs: Any,
        terminated: Any,
        truncated: Any = None,
        *,
        extras: Optional[Mapping[str, Any]] = None,
        next_action_mask: Any = None,
        weights_version: int = -1,
        sync_every: int = 1,
    ) -> Learned:
        """Experience gathered with a copy of the policy (`replayColumns`): row i is one
        step of env copy ``envs[i]`` (a copy's steps in time order), with the model
        outputs the copy declares in `extras`. The answer carries the weights once they
        are `sync_every` updates newer than `weights_version`."""
        body: dict[str, Any] = {
            "envs": np.asarray(envs),
            "obs": as_columns(obs),
            "actions": np.asarray(actions),
            "rewards": np.asarray(rewards),
            "nextObs": as_columns(next_obs),
            "terminated": np.asarray(terminated),
            "weightsVersion": int(weights_version),
            "syncEvery": int(sync_every),
        }
        if truncated is not None:
            body["truncated"] = np.asarray(truncated)
        if extras:
            body["extras"] = {k: np.asarray(v) for k, v in extras.items()}
        if next_action_mask is not None:
            body["nextActionMask"] = np.asarray(next_action_mask)
        answer = self._call(
            "POST", "/replayColumns", json_body=body, tensors=self.binary, columns=True
        )
        return Learned.model_construct(
            env_steps=int(answer["envSteps"]),
            version=int(answer["version"]),
            weights=_arrays(answer.get("weights")),
        )

    def episode_stopped(self) -> Status:
        return self._status_call("POST", "/episodeStopped")

    def reset(
        self, unload_model: bool = True, *, wait: bool = True, timeout: Optional[float] = None
    ) -> Status:
        accepted = self._status_call("POST", "/reset", params={"unloadModel": unload_model})
        return self._finish(accepted, wait, timeout)


class OrchestratorClient(_ServiceClient):
    """Client of an orchestrator service (``/v1/mistk/orchestrator``)."""

    base_path = "/v1/mistk/orchestrator"

    def initialize(
        self,
        env: Union[dict, str],
        agents_needed: int = 1,
        *,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Status:
        """`env` is ``{"id": ..., "kwargs": {...}}`` or just the id."""
        env = {"id": env} if isinstance(env, str) else env
        body = OrchestratorInitParams(env=env, agents_needed=agents_needed)
        return self._finish(
            self._status_call("POST", "/initialize", json_body=body.wire()), wait, timeout
        )

    def set_up(
        self,
        env: Union[dict, str],
        agents: Sequence[tuple[str, str, bool]],
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Make this orchestrator ready to play `env` with `agents` ((name, url, skipTrain)
        each), whatever it was doing: reset unless it is new (leaving the agents as they
        are: they may be playing on other orchestrators), initialize, register each. How a
        league sets up its workers, and the harness its evaluator."""
        if self.status().state != "uninitialized":
            self.reset(reset_agents=False, timeout=timeout)
        self.initialize(env, agents_needed=len(agents), timeout=timeout)
        for name, url, skip_train in agents:
            self.register_agent(name, url, skip_train=skip_train)

    def register_agent(
        self,
        agent_name: str,
        agent_url: str,
        skip_train: bool = False,
        seats: Optional[Sequence[str]] = None,
        local_inference: bool = False,
    ) -> Status:
        """Register the agent at `agent_url`; for games, `seats` it holds (default: the
        orchestrator binds them). `local_inference`: the agent will act through a policy
        copy in the orchestrator, which checks both sides now and loads torch in the set-up
        rather than in the first episode."""
        params = {"agentName": agent_name, "agentUrl": agent_url, "skipTrain": skip_train}
        if seats:
            params["seats"] = ",".join(seats)
        if local_inference:
            params["localInference"] = True
        return self._status_call("POST", "/registerAgent", params=params)

    def start_episode(
        self,
        config: Union[EpisodeSettings, dict, None] = None,
        *,
        wait: bool = False,
        timeout: Optional[float] = None,
        on_status: Optional[Callable[[Status], None]] = None,
    ) -> Status:
        """Start running episodes; with ``wait=True``, return once they completed
        (`on_status` sees each status meanwhile: envSteps, episodesDone, ...)."""
        if isinstance(config, EpisodeSettings):  # an orchestrator's own (forwarding a call)
            config = config.model_dump(by_alias=True, exclude_unset=True)
        config = EpisodeConfig.model_validate(config or {})
        accepted = self._status_call("POST", "/startEpisode", json_body=config.wire())
        return self.wait_until_done(accepted, timeout, on_status) if wait else accepted

    def play(
        self,
        config: Union[EpisodeSettings, dict, None] = None,
        *,
        timeout: Optional[float] = None,
        on_status: Optional[Callable[[Status], None]] = None,
        episodes: bool = True,
    ) -> Played:
        """One startEpisode to completion, then stopEpisode (back to ready): what the call
        played, its results fetched from the count before it on (a game run holds tens of
        thousands). `episodes` False: the call's counts, totals and evaluations only (a
        long block's tens of thousands of episodes are neither sent nor held; the run's
        episodes.jsonl gets them in pages). A call that does not finish within `timeout`
        is stopped (best effort) before WaitTimeout is raised, so the service is not left
        running it."""
        before = self.progress()
        try:
            self.start_episode(config, wait=True, timeout=timeout, on_status=on_status)
        except WaitTimeout:
            try:
                self.stop_episode()
            except ServiceError:
                pass
            raise
        self.stop_episode()
        after = self.progress()
        results = self.get_results(since=(before if episodes else after).episodes_done)
        return Played(results, before, after)

    def save_episode(self, path: str) -> Status:
        return self._status_call("POST", "/saveEpisode", params={"path": path})

    def stop_episode(self) -> Status:
        return self._status_call("POST", "/stopEpisode")

    def get_results(self, since: int = 0, limit: Optional[int] = None) -> Results:
        """The finished episodes (numbered from `since` on, at most `limit` of them) and,
        for games, the totals and evaluations."""
        params: dict[str, int] = {"since": since} if since else {}
        if limit is not None:
            params["limit"] = limit
        return Results.model_validate(self._call("GET", "/results", params=params or None))

    def iter_episodes(self, since: int = 0, page: int = RESULTS_PAGE) -> Iterator[EpisodeResult]:
        """Every finished episode from `since` on, fetched `page` at a time (a long run
        has millions: neither the service nor the caller holds them all at once). Stops at
        the first short page, so it ends even while the run goes on."""
        while True:
            episodes = self.get_results(since, limit=page).episodes
            yield from episodes
            if len(episodes) < page:
                return
            since += len(episodes)

    def progress(self) -> OrchestratorProgress:
        """The status payload now, typed: envSteps, episodesDone, agentSteps (games), the
        game's seats, a league's counts (the spec's OrchestratorProgress)."""
        return OrchestratorStatus.model_validate(self._call("GET", "/status")).payload

    def get_league(self) -> League:
        """A league orchestrator's players, payoff matrix, ratings and jobs (NotFound from
        any other orchestrator)."""
        return League.model_validate(self._call("GET", "/league"))

    def add_league_worker(self, url: str, replaces: Optional[str] = None) -> LeagueWorkerJoin:
        """A league orchestrator takes the worker at `url` (in place of the worker at
        `replaces`, which is dropped): more capacity, or a worker started again elsewhere."""
        return LeagueWorkerJoin.model_validate(
            self._call(
                "POST",
                "/league/workers",
                json_body=LeagueWorkerJoin(url=url, replaces=replaces).wire(),
            )
        )

    def reset(
        self, *, reset_agents: bool = True, wait: bool = True, timeout: Optional[float] = None
    ) -> Status:
        """Back to uninitialized; the registered agents are reset too unless `reset_agents`
        is False (they are only forgotten: a league's worker, whose agents play elsewhere)."""
        params = None if reset_agents else {"resetAgents": False}
        return self._finish(self._status_call("POST", "/reset", params=params), wait, timeout)


def _column_actions(answer: Mapping[str, Any]) -> ColumnActions:
    return ColumnActions.model_construct(  # (arrays: no validation to do)
        actions=np.asarray(answer["actions"]),
        step_ids=np.asarray(answer["stepIds"], dtype=np.int64),
    )


class ColumnPipeline:
    """stepColumns requests sent before the answers to earlier ones are read: `send` takes
    `AgentClient.step_columns`' arguments and returns at once, `receive` gives the oldest
    request's answer. The agent service runs them one at a time in the order sent.
    `mistk_rl.sdk.stepping.ColumnStepper` uses it to step half its env copies while the agent
    answers for the other half (``depth`` 2), and for the step stream at any depth.

    The requests go as HTTP/1.1 pipelining on a connection of their own
    (`mistk_rl.sdk.transport.PipelinedConnection`) or, with `stream`, as frames on the agent's
    step stream (`mistk_rl.wire.frames`, capability ``stream``): no HTTP per step. The stream
    opens at the first `send` with the encoding of that request (`AgentClient.binary`), and
    again after `close` or when the encoding changes; an agent whose server cannot upgrade (426) or
    whose steps do not run inline (501) is stepped over HTTP instead."""

    def __init__(self, client: AgentClient, stream: bool = False) -> None:
        self.client = client
        self.stream = stream
        self._pipe = None if stream else client.transport.pipeline()
        self._stream: Optional[Stream] = None
        self._opened_as: tuple[str, str] = ("", "")  # the stream's Content-Type and Accept
        self._sent: deque[_Request] = deque()

    @property
    def pending(self) -> int:
        return len(self._sent)

    @property
    def upgraded(self) -> bool:
        """Whether the requests go as frames on the step stream (else over HTTP: not asked
        for, not sent yet, or the agent could not upgrade)."""
        return self._stream is not None

    def send(self, envs: Any, obs: Any, **columns: Any) -> None:
        self.send_body(step_body(envs, obs, **columns))

    def send_body(self, body: Mapping[str, Any]) -> None:
        """`send` with a body as `mistk_rl.wire.step_columns.step_body` builds it."""
        client = self.client
        request = client._request(
            "POST",
            "/stepColumns",
            json_body=body,
            tensors=client.binary,
            columns=True,
        )
        wire = request.wire
        try:
            stream = self._stream_for(request) if self.stream else None
            if stream is not None:
                stream.send(wire["body"], wire["timeout"])
            else:
                self._pipe.send("POST", "/stepColumns", **wire)  # type: ignore[union-attr]
        except TransportError as exc:
            self._sent.clear()
            raise request.unavailable(exc) from exc
        self._sent.append(request)

    def receive(self) -> ColumnActions:
        request = self._sent.popleft()
        try:
            response = self._stream.receive() if self._stream is not None else self._pipe.receive()  # type: ignore[union-attr]
        except TransportError as exc:
            self._sent.clear()
            raise request.unavailable(exc) from exc
        return _column_actions(self.client._answer(request, response))

    def _stream_for(self, request: _Request) -> Optional[Stream]:
        """The open step stream for `request`'s encoding (opened now if need be), or None
        when the agent cannot stream after all (then requests go over HTTP from now on)."""
        wire = request.wire
        opened_as = (wire["content_type"], wire["accept"])
        if self._stream is not None and (self._stream.closed or opened_as != self._opened_as):
            if self._sent:
                raise RuntimeError("stepColumns: the encoding changed with frames in flight")
            self._stream.close()
            self._stream = None
        if self._stream is None:
            stream, response = self.client.transport.open_stream(
                frames.PATH,
                content_type=wire["content_type"],
                accept=wire["accept"],
                timeout=wire["timeout"],
            )
            opening = _Request("GET", frames.PATH, request.base_url, False, wire)
            if stream is None and response.status in (426, 501):
                log.warning(
                    "%s: no step stream (%d); stepping over HTTP requests",
                    request.base_url,
                    response.status,
                )
                self.stream, self._pipe = False, self.client.transport.pipeline()
                return None
            try:
                self.client._answer(opening, response)  # (a refusal raises its error)
            except ServiceError:  # (a restarted service, say: the stream is not kept)
                if stream is not None:
                    stream.close()
                raise
            self._stream, self._opened_as = stream, opened_as
        return self._stream

    def close(self) -> None:
        """Drop what is in flight (its answers are not read) and free the connection (a
        stream ends)."""
        self._sent.clear()
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._pipe is not None:
            self._pipe.close()
