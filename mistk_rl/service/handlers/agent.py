"""The agent service's handlers (`AgentService`): the request bodies turned into numpy
arrays and checked against the registered spaces, kept steps, and the agent's hooks."""

from __future__ import annotations

import gc
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import IllegalState, InvalidRequest, UpgradeRequired
from mistk_rl.framework.agent import AbstractAgent, Acting, EpisodeInfo, ReplayBatch, Transitions
from mistk_rl.lifecycle import AGENT, Lifecycle
from mistk_rl.limits import Limits
from mistk_rl.service.handlers.common import (
    JSON,
    Response,
    ServiceBase,
)
from mistk_rl.service.steps import StepStore, entity_acting, entity_transitions
from mistk_rl.spaces import (
    ValueCheck,
    mask_check,
    observation_dtypes,
    space_from_request,
    value_check,
)
from mistk_rl.wire import codec, frames
from mistk_rl.wire.codec import StackedMap
from mistk_rl.wire.columns import Columns
from mistk_rl.wire.step_columns import (
    RowsView,
    read_column,
    read_flags,
    read_numbers,
    read_step,
)


def _arrays(
    values: dict[str, Any],
    check: ValueCheck,
    field: str,
    dtypes: Optional[dict[str, np.dtype]] = None,
) -> dict[str, Any]:
    """entity -> array, each checked against its space (`check`); for dict observations
    entity -> {key: array}, cast to `dtypes` (per key) once checked. The binary encoding's
    rows are views into the request body: they are copied (once per field) so an agent that
    keeps them (a replay buffer) does not keep every request body alive with them."""
    if isinstance(values, StackedMap):
        check(values, field)
        if isinstance(values.array, dict):
            columns = {
                key: array.astype(dtypes[key]) if dtypes else array.copy()
                for key, array in values.array.items()
            }
            return {
                entity: {key: column[i] for key, column in columns.items()}
                for i, entity in enumerate(values)
            }
        return dict(zip(values, values.array.copy()))
    if len(values) > 4:  # many entities: one array for all (one numpy call, one check)
        try:
            array = np.asarray(list(values.values()))
        except ValueError:  # ragged: the entity-by-entity path below says where
            array = None
        if array is not None and array.dtype.kind in "biuf" and array.ndim >= 1:
            stacked = StackedMap(zip(values, array))
            stacked.array = array
            check(stacked, field)
            return stacked
    try:
        arrays: dict[str, Any] = {
            key: {k: np.asarray(v) for k, v in value.items()}
            if isinstance(value, dict)
            else np.asarray(value)
            for key, value in values.items()
        }
    except ValueError as exc:  # ragged nested lists
        raise InvalidRequest(
            f"{field}: every value must be a rectangular array of numbers ({exc})", field=field
        ) from exc
    check(arrays, field)
    if dtypes:  # (checked: integral and in range where the dtype is an integer one)
        arrays = {
            entity: {key: value.astype(dtypes[key], copy=False) for key, value in obs.items()}
            for entity, obs in arrays.items()
        }
    return arrays


def _finite(values: dict[str, Any], field: str) -> dict[str, float]:
    """Rewards: one finite number per entity."""
    out = {
        key: float(value) if type(value) in (float, int) else _one_number(value)
        for key, value in values.items()
    }
    bad = next((k for k, v in out.items() if not math.isfinite(v)), None)
    if bad is not None:
        raise InvalidRequest(
            f"{field}[{bad!r}]: one finite number per entity", field=field, entity=bad
        )
    return out


def _one_number(value: Any) -> float:
    """The number in `value`, or NaN when it holds more or fewer (refused as a NaN is)."""
    return float(np.asarray(value).reshape(-1)[0]) if np.size(value) == 1 else math.nan


@dataclass(frozen=True)
class _SpaceChecks:
    """What the registered spaces allow, compiled once per registration."""

    obs: ValueCheck
    action: ValueCheck
    mask: ValueCheck  # actionMask: the actions to pick from now, at least one
    next_mask: ValueCheck  # a replayed newActionMask: none allowed once an episode is over
    obs_dtypes: Optional[dict[str, np.dtype]]  # a Dict space's: what its keys are cast to
    obs_dtype: Optional[np.dtype] = None  # a fundamental space's: what columns are cast to
    action_dtype: Optional[np.dtype] = None  # the narrowest dtype of the actions answered

    @classmethod
    def of(cls, obs_space: Any, act_space: Any) -> "_SpaceChecks":
        return cls(
            value_check(obs_space, "the observation space is", float_bounds=False),
            value_check(act_space, "the action space is"),
            mask_check(act_space),
            mask_check(act_space, allows_some=False),
            observation_dtypes(obs_space),
            None
            if obs_space is None or isinstance(obs_space, spaces.Dict)
            else np.dtype(obs_space.dtype),
            _action_dtype(act_space),
        )

    def observations(self, values: dict[str, Any], field: str) -> dict[str, Any]:
        return _arrays(values, self.obs, field, self.obs_dtypes)

    def obs_columns(self, value: Any, field: str, rows: int) -> Columns:
        """Observation columns (a Dict space's: an object with one column per key), checked
        against the space in one pass per column, cast to the space's dtypes."""
        if self.obs_dtypes is None:
            column = read_column(value, field, rows)
            self.obs(RowsView(column, rows), field)
            return column if self.obs_dtype is None else column.astype(self.obs_dtype, copy=False)
        if not isinstance(value, dict) or value.keys() != self.obs_dtypes.keys():
            given = sorted(value) if isinstance(value, dict) else "one column"
            raise InvalidRequest(
                f"{field}: one column per key of the Dict space "
                f"{sorted(self.obs_dtypes)}, not {given}",
                field=field,
            )
        columns = {
            key: read_column(column, f"{field}[{key!r}]", rows) for key, column in value.items()
        }
        self.obs(RowsView(columns, rows), field)
        return {
            key: column.astype(self.obs_dtypes[key], copy=False) for key, column in columns.items()
        }

    def mask_columns(self, value: Any, field: str, rows: int, now: bool = True) -> np.ndarray:
        """Action masks [rows, A]; `now`: each row must allow an action (else it is the
        mask of a final observation, which may allow none)."""
        column = read_column(value, field, rows, "biu")
        (self.mask if now else self.next_mask)(RowsView(column, rows), field)
        return column.astype(bool, copy=False)


def _action_dtype(space: Any) -> Optional[np.dtype]:
    """Discrete actions travel as the narrowest integer type that holds the space (a byte
    for up to 256 actions); other spaces' as their dtype."""
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n - 1)
        return np.result_type(np.min_scalar_type(low), np.min_scalar_type(high))
    return None if space is None or isinstance(space, spaces.Dict) else np.dtype(space.dtype)


def _replay_batch(body: dict[str, Any], checks: _SpaceChecks, prefix: str = "") -> ReplayBatch:
    """A replay body as arrays, after checking every field names the same entities and
    every value belongs to its space."""
    entities = set(body["actions"])
    for key in ("prevObs", "rewards", "newObs", "terminated", "newActionMask"):
        if key in body and set(body[key]) != entities:
            raise InvalidRequest(
                f"{prefix}{key} names entities {sorted(body[key])}, "
                f"{prefix}actions names {sorted(entities)}"
            )
    return ReplayBatch(
        prev_obs=checks.observations(body["prevObs"], prefix + "prevObs"),
        actions=_arrays(body["actions"], checks.action, prefix + "actions"),
        rewards=_finite(body["rewards"], prefix + "rewards"),
        new_obs=checks.observations(body["newObs"], prefix + "newObs"),
        terminated=dict(body["terminated"]),
        truncated={k: body.get("truncated", {}).get(k, False) for k in entities},
        new_action_mask=_arrays(body["newActionMask"], checks.next_mask, prefix + "newActionMask")
        if body.get("newActionMask")
        else None,
    )


def _extras(
    given: Any, declared: Mapping[str, tuple], optional: Iterable[str], rows: int
) -> dict[str, np.ndarray]:
    """replayColumns' extras: the columns the policy copy declares (name -> row shape),
    finite numbers, all but the optional ones present."""
    if not isinstance(given, dict):
        raise InvalidRequest("extras: an object of columns", field="extras")
    unknown = sorted(set(given) - set(declared))
    missing = sorted(set(declared) - set(given) - set(optional))
    if unknown or missing:
        raise InvalidRequest(
            f"extras: the policy copy declares {sorted(declared) or 'none'}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else ""),
            field="extras",
        )
    columns = {}
    for name, value in given.items():
        column = read_column(value, f"extras[{name!r}]", rows)
        if column.shape[1:] != tuple(declared[name]) or not np.isfinite(column).all():
            raise InvalidRequest(
                f"extras[{name!r}]: rows of shape {tuple(declared[name])} "
                f"of finite numbers, not {column.shape[1:]}",
                field=f"extras.{name}",
            )
        columns[name] = column
    return columns


def _policy_answer(copy: Any) -> dict[str, Any]:
    answer = {
        "policy": copy.policy,
        "config": copy.config,
        "seed": copy.seed,
        "observationSpace": copy.observation_space,
        "actionSpace": copy.action_space,
        "envSteps": copy.env_steps,
        "warmupUntil": copy.warmup_until,
        "version": copy.version,
        "extras": {name: list(shape) for name, shape in copy.extras.items()},
        "optionalExtras": list(copy.optional_extras),
    }
    if copy.weights is not None:
        answer["weights"] = codec.pack_arrays(copy.weights)
    return answer


def _finish(rest: Any) -> None:
    """Run now what `do_learn` left for later: an answer that says the agent has learned.
    (Only a callable is work left: what else an agent's do_learn returns means nothing.)"""
    if callable(rest):
        rest()


def _plain(actions: np.ndarray) -> list:
    """Actions as JSON-ready Python values, one per row."""
    return np.asarray(actions).tolist()


class AgentService(ServiceBase):
    role = "agent"
    # step: replayAction + getAction in one call; tensors: the binary encoding on the step
    # path; columns: stepColumns; stream: stepColumns as frames on an upgraded connection
    # (`mistk_rl.wire.frames`; an agent whose steps do not run inline has none)
    capabilities: tuple[str, ...] = ("step", "tensors", "columns", "stream")

    def __init__(
        self,
        agent: AbstractAgent,
        data_dir: Path,
        limits: Limits = Limits(),
        shares: Optional[dict[str, Path]] = None,
    ) -> None:
        super().__init__(agent, Lifecycle(AGENT), data_dir, limits, shares)
        self.agent = agent
        self._initialized = False
        # a model may be built (buildModel, or an agent that builds at registration): the
        # next buildModel or unloading reset drops it (`_free_dropped_models`)
        self._holds_model = False
        self._checks = _SpaceChecks.of(None, None)  # until an orchestrator gives spaces
        self.steps = StepStore()  # what the agent acted on, by step id
        # an eval episode never learns: its steps are not kept (step ids -1), so it cannot
        # push out what a training run left in flight (a resumed run's actions, say)
        self._keeps_steps = True
        if not agent.steps_inline:  # (the stream answers its frames on the event loop)
            self.capabilities = tuple(c for c in self.capabilities if c != "stream")
        if agent.local_inference:  # getPolicy and replayColumns
            self.capabilities = (*self.capabilities, "local")

    def initialize(self, body: dict[str, Any]) -> Response:
        props, hparams = body.get("modelProperties", {}), body.get("hyperparameters", {})
        self.agent.validate_initialize(props, hparams)

        def hook() -> None:
            self.agent.do_initialize(props, hparams)
            self._initialized = True

        return self._accepted("initialize", hook)

    def buildModel(self, model_path: Optional[str] = None) -> Response:  # noqa: N802
        path = self._path(model_path) if model_path else None
        if path is not None and not path.exists():
            raise InvalidRequest(f"modelPath {model_path!r} does not exist in the data dir")

        def hook() -> None:
            try:
                self.agent.do_build_model(path)
            finally:  # (one that fails may have dropped the model it had too)
                if self._holds_model:
                    _free_dropped_models()
            self._holds_model = True

        return self._accepted("build_model", hook)

    def saveModel(self, model_path: str) -> Response:  # noqa: N802
        path = self._path(model_path)
        return self._accepted("save_model", lambda: self.agent.do_save_model(path))

    def agentRegistered(self, body: dict[str, Any]) -> Response:  # noqa: N802
        obs_space, act_space = (
            self._space(body, key) for key in ("observationSpace", "actionSpace")
        )
        self.lifecycle.check("agent_registered")  # before the agent's own (costly) check
        self.agent.validate_registration(obs_space, act_space)
        self.agent.validate_registration_properties(body.get("properties") or {})

        def hook() -> None:
            self.agent.name = body["name"]
            self.agent.observation_space, self.agent.action_space = obs_space, act_space
            self.agent.train = body.get("train", True)
            self.agent.do_agent_registered(body)
            self._holds_model = True
            self._checks = _SpaceChecks.of(obs_space, act_space)

        self.lifecycle.run("agent_registered", hook)
        return self._done()

    def _space(self, body: dict[str, Any], key: str) -> Any:
        return space_from_request(body[key], self.limits, key) if key in body else None

    def episodeStarted(self, body: dict[str, Any]) -> Response:  # noqa: N802
        checks = self._checks
        info = EpisodeInfo(
            obs=checks.observations(body["obs"], "obs"),
            mode=body.get("mode", "collect"),
            episode=body.get("episode"),
            epsilon=body.get("epsilon"),
            action_mask=_arrays(body["actionMask"], checks.mask, "actionMask")
            if "actionMask" in body
            else None,
        )
        self.agent.validate_episode_start(info)

        def hook() -> None:
            self.steps.end_episode()
            self._keeps_steps = info.mode != "eval"
            self.agent.do_episode_started(info)

        self.lifecycle.run("episode_started", hook)
        return self._done()

    def getAction(self, body: dict[str, Any]) -> Response:  # noqa: N802
        acting = self._acting(body)
        return {"actions": self.lifecycle.run("get_action", lambda: self._act(acting))}, 200, JSON

    def replayAction(self, body: dict[str, Any]) -> Response:  # noqa: N802
        replay = _replay_batch(body, self._checks)

        def hook() -> None:
            _finish(self._learn_entities(replay))  # (the answer says it has learned)

        self.lifecycle.run("replay_action", hook)
        return self._done()

    def step(self, body: dict[str, Any]) -> Response:
        replay = (
            _replay_batch(body["replay"], self._checks, "replay.") if body.get("replay") else None
        )
        acting = self._acting(body)

        def hook() -> Any:
            rest = self._learn_entities(replay) if replay is not None else None
            actions = self._act(acting)
            self._learn_after_answer(rest)
            return actions

        return {"actions": self.lifecycle.run("step", hook)}, 200, JSON

    def _learn_after_answer(self, rest: Any) -> None:
        """What `do_learn` left for later runs once the step's answer is out
        (`Lifecycle.defer`); only a callable is work left (as in `_finish`)."""
        if callable(rest):
            self.lifecycle.defer(rest)

    def stepColumns(self, body: dict[str, Any]) -> Response:  # noqa: N802
        """The columnar step (module `mistk_rl.service.steps`): the outcomes of earlier
        steps, named by step id, become transitions the agent learns from; then it acts on
        the rows that act. Everything is checked before the lifecycle moves. What of the
        learning can wait (`AbstractAgent.do_learn`'s answer) runs after the answer is out
        (`Lifecycle.defer`), while the caller steps its envs."""
        request = read_step(body, self._checks, self._check_rows)
        kept = self.steps.lookup(request.step_ids) if len(request.step_ids) else None

        def hook() -> Any:
            rest = None
            if kept is not None:
                rest = self.agent.do_learn(request.transitions(kept))
                self.steps.release(request.step_ids)
            if request.acting is None:
                answer: dict[str, Any] = {"actions": [], "stepIds": []}
            else:
                acted = self.agent.do_act(request.acting)
                ids = (
                    self.steps.put(request.acting.obs, acted)
                    if self._keeps_steps
                    else np.full(len(acted.actions), -1, np.int64)
                )
                answer = {"actions": self._answer(acted.actions), "stepIds": ids}
            self._learn_after_answer(rest)
            return answer

        return self.lifecycle.run("step", hook), 200, JSON

    def stepStream(self) -> Response:  # noqa: N802
        """Reached only by a request that does not upgrade: the services' HTTP protocol
        (`mistk_rl.service.uvicorn_protocol.CoalescingHttpTools`) takes the upgraded ones."""
        raise UpgradeRequired(
            f"open the step stream with 'Connection: Upgrade' and 'Upgrade: "
            f"{frames.PROTOCOL}'; its frames are stepColumns bodies "
            "(mistk_rl.wire.frames)",
            frames.PROTOCOL,
        )

    # ---- local inference: a copy of the policy acts next to the env ----------------------
    def getPolicy(self, weights: bool = True) -> Response:  # noqa: N802
        """The policy copy (`AbstractAgent.do_policy_copy`); read on the step path, so no
        step or update writes the weights while they are read."""
        self._policy_copy("getPolicy")
        return _policy_answer(self.agent.do_policy_copy(weights)), 200, JSON

    def replayColumns(self, body: dict[str, Any]) -> Response:  # noqa: N802
        """Experience from a copy of the policy: whole transitions in columns, learned from
        as the agent's own steps; newer weights in the answer when due."""
        copy = self._policy_copy("replayColumns")
        transitions = self._replay_columns(body, copy)
        since, every = body.get("weightsVersion", -1), body.get("syncEvery", 1)

        def hook() -> Any:
            _finish(self.agent.do_learn(transitions))  # (the answer's weights need it)
            now = self.agent.do_policy_copy(weights=False)
            answer: dict[str, Any] = {"envSteps": now.env_steps, "version": now.version}
            if now.version >= since + every:
                weights = self.agent.do_policy_copy(weights=True).weights
                assert weights is not None  # (asked for)
                answer["weights"] = codec.pack_arrays(weights)
            return answer

        return self.lifecycle.run("replay_action", hook), 200, JSON

    def _policy_copy(self, operation: str) -> Any:
        """The policy copy without weights, or why `operation` has none (before any state
        change)."""
        if not self.agent.local_inference:
            raise InvalidRequest(
                f"{type(self.agent).__name__} offers no local inference (no capability 'local')"
            )
        state = self.lifecycle.state
        if state not in ("ready", "in_episode"):
            raise IllegalState(
                operation,
                state,
                self.lifecycle.allowed(),
                detail=f"{operation}: no registered model in state '{state}' "
                "(register the agent first)",
            )
        return self.agent.do_policy_copy(weights=False)

    def _replay_columns(self, body: dict[str, Any], copy: Any) -> Transitions:
        """A replayColumns body as `Transitions`, every column checked against the spaces
        and the extras against what the policy copy declares."""
        checks = self._checks
        envs = read_column(body["envs"], "envs", len(body["envs"]), "iu")
        n = len(envs)
        if envs.ndim != 1 or (envs < 0).any():
            raise InvalidRequest("envs: one env copy index (>= 0) per row", field="envs")
        self.limits.check(
            "max_envs", len(np.unique(envs)), "the env copies of a replayColumns request"
        )
        actions = read_column(body["actions"], "actions", n)
        checks.action(RowsView(actions, n), "actions")
        rewards = read_numbers(body["rewards"], "rewards", n)
        return Transitions(
            envs=envs,
            obs=checks.obs_columns(body["obs"], "obs", n),
            actions=actions,
            extras=_extras(body.get("extras") or {}, copy.extras, copy.optional_extras, n),
            rewards=rewards,
            next_obs=checks.obs_columns(body["nextObs"], "nextObs", n),
            terminated=read_flags(body["terminated"], "terminated", n),
            truncated=(
                read_flags(body["truncated"], "truncated", n)
                if "truncated" in body
                else np.zeros(n, bool)
            ),
            next_action_mask=(
                checks.mask_columns(body["nextActionMask"], "nextActionMask", n, now=False)
                if body.get("nextActionMask") is not None
                else None
            ),
        )

    # ---- the step path's pieces --------------------------------------------------------
    def _acting(self, body: dict[str, Any]) -> Acting:
        """The entity form's observations (and masks) as rows, checked."""
        return entity_acting(*self._observations(body))

    def _act(self, acting: Acting) -> dict[str, Any]:
        """Act on the entity form's rows; entity -> action, each kept under a step id."""
        acted = self.agent.do_act(acting)
        if self._keeps_steps:
            self.steps.put(acting.obs, acted, acting.names)
        return dict(zip(acting.row_names(self.agent.name), _plain(acted.actions)))

    def _learn_entities(self, replay: ReplayBatch) -> Any:
        """Learn from the entity form's replay; what of it can wait (`do_learn`)."""
        transitions = entity_transitions(replay, self.steps)
        rest = self.agent.do_learn(transitions)
        self.steps.forget(transitions.row_names(self.agent.name))
        return rest

    def _check_rows(self, n: int) -> None:
        self.limits.check("max_envs", n, "the rows of a stepColumns request")

    def _answer(self, actions: Any) -> np.ndarray:
        """Actions as the narrowest dtype of the space (a byte per Discrete(n <= 256))."""
        actions = np.asarray(actions)
        dtype = self._checks.action_dtype
        return actions if dtype is None or actions.dtype == dtype else actions.astype(dtype)

    def _observations(self, body: dict[str, Any]) -> tuple[dict, Optional[dict]]:
        """A request's observations and action masks, checked against the spaces."""
        obs = self._checks.observations(body["obs"], "obs")
        if body.get("actionMask") and body["actionMask"].keys() != obs.keys():
            raise InvalidRequest(
                f"actionMask names entities {sorted(body['actionMask'])}, obs "
                f"names {sorted(obs)}: one mask per entity",
                field="actionMask",
            )
        mask = (
            _arrays(body["actionMask"], self._checks.mask, "actionMask")
            if body.get("actionMask")
            else None
        )
        return obs, mask

    def episodeStopped(self) -> Response:  # noqa: N802
        def hook() -> None:
            self.steps.end_episode()
            self.agent.do_episode_stopped()

        self.lifecycle.run("episode_stopped", hook)
        return self._done()

    def reset(self, unload_model: bool = True) -> Response:
        def hook() -> None:
            self.steps.clear()
            self.agent.do_reset(unload_model)
            self._initialized = self._initialized and not unload_model
            if unload_model and self._holds_model:
                self._holds_model = False
                _free_dropped_models()

        def facts() -> dict[str, bool]:
            return {"keep_model": self._initialized}

        return self._accepted("reset", hook, facts=facts)


def _free_dropped_models() -> None:
    """Free the model an agent just dropped (buildModel replacing it, reset unloading it).
    A model is a web of reference cycles (a policy's modes hold its own bound methods), so
    only Python's cycle collector frees it, and in a process this size the full collection
    that reaches it runs rarely (when the long-lived objects have grown by a quarter): every
    dropped model kept its tensors and replay buffer meanwhile, +16 MiB per reset for a
    league's main exploiter. One full collection per model change frees it at once: 0.25 to
    0.3 s for an agent's ~350,000 objects on a busy 2-core machine, on the operation's
    thread (it holds the GIL meanwhile, as Python's own full collections do), only where
    there was a model to drop (not at a service's first buildModel)."""
    gc.collect()
