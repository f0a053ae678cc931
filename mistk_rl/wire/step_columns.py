"""The columnar step (``stepColumns``) in one place: the body an orchestrator sends
(`step_body`), what the agent's service reads from it (`read_step`), and what the agent is
handed: `Acting` to act on, `Transitions` to learn from.

Row i of every column is env copy ``envs[i]``. A row may report the outcome of an earlier
step, named by the step id its answer gave; what it reports is the table `REPORTED`, one
column per field. Both encodings carry the same body, JSON or binary columns
(`mistk_rl.wire.codec`'s column form): the transport picks one, and everything here works on
the body as a dict of arrays (binary) or nested lists (JSON).

To add a field a step reports (say a per-step cost):

1. its line in the spec's ``StepColumns`` (``mistk_rl/openapi/agent.yaml``);
2. its row in `REPORTED` here (a field of `Transitions` of the same name, if agents are to
   read it as an attribute; otherwise it reaches them as ``transitions.reported[name]``);
3. the learner that reads it.

`step_body` (the client's ``step_columns``, its pipeline and the stepper), `read_step` (the
service's checks) and the transitions follow from the table; ``tests/test_step_contract.py``
adds a field this way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal, Optional, Protocol

import numpy as np

from mistk_rl.errors import InvalidRequest
from mistk_rl.wire.columns import Columns, take_rows


@dataclass(frozen=True)
class ReportedField:
    """A per-row column that reports an earlier step's outcome."""

    wire: str  # its name in the body (the spec's StepColumns)
    name: str  # its name in Python: `step_body`'s argument, the `Transitions` field
    kind: Literal["number", "flag"]  # a finite float, or true/false (0/1)
    required: bool = True  # when rows report; else `default` where the body leaves it out
    default: Any = None


REPORTED: tuple[ReportedField, ...] = (
    ReportedField("rewards", "rewards", "number"),
    ReportedField("terminated", "terminated", "flag"),
    ReportedField("truncated", "truncated", "flag", required=False, default=False),
)

# the body's other fields: what the rows act on, and which steps they report
_ROW_FIELDS = (("action_mask", "actionMask"), ("step_ids", "stepIds"))
RESET_FIELDS = ("rows", "obs", "actionMask")  # `reset`: rows whose episode was reset


def body_fields() -> set[str]:
    """The fields a stepColumns body may have (the spec's StepColumns lists the same)."""
    return {"envs", "obs", "act", "reset", *(w for _, w in _ROW_FIELDS)} | {
        f.wire for f in REPORTED
    }


# ---- what the agent is handed ---------------------------------------------------------------
@dataclass
class Acting:
    """What to act on, in columns: row i is env copy ``envs[i]`` (or entity ``names[i]``,
    when the request was keyed by entity: getAction, step)."""

    envs: np.ndarray  # [N] int
    obs: Columns
    action_mask: Optional[np.ndarray] = None  # [N, A] bool: the legal actions now
    names: Optional[list[str]] = None  # the entity form's keys

    def __len__(self) -> int:
        return len(self.envs)

    def row_names(self, agent_name: Optional[str]) -> list[str]:
        """An entity name per row: the request's, or ``<agent>:<env>`` for columns (what
        an orchestrator names its env copies in the entity form)."""
        return _row_names(self.envs, self.names, agent_name)

    def obs_row(self, i: int) -> Any:
        return (
            {key: column[i] for key, column in self.obs.items()}
            if isinstance(self.obs, dict)
            else self.obs[i]
        )


@dataclass
class Transitions:
    """Rows of transitions, assembled by the service from what the agent acted on (obs,
    actions, extras: kept under each step's id) and what the env answered (`REPORTED`:
    rewards and flags; the next observations and masks)."""

    envs: np.ndarray  # [N] int
    obs: Columns
    actions: np.ndarray
    extras: dict[str, np.ndarray]  # as `Acted` gave them; empty for a row's action the
    # agent did not choose (the stateless replayAction, with an action of the caller's)
    rewards: np.ndarray  # [N] float
    next_obs: Columns
    terminated: np.ndarray  # [N] bool
    truncated: np.ndarray  # [N] bool
    next_action_mask: Optional[np.ndarray] = None  # legal actions in next_obs
    names: Optional[list[str]] = None
    matched: Optional[np.ndarray] = None  # [N] bool: extras hold this row's (None: all)
    reported: dict[str, np.ndarray] = field(default_factory=dict)  # `REPORTED`'s other fields

    def __len__(self) -> int:
        return len(self.envs)

    def row_names(self, agent_name: Optional[str]) -> list[str]:
        return _row_names(self.envs, self.names, agent_name)

    def take(self, rows: np.ndarray) -> Transitions:
        """These rows only, in this order."""

        def part(columns: Any) -> Any:
            return None if columns is None else take_rows(columns, rows)

        return Transitions(
            envs=self.envs[rows],
            obs=part(self.obs),
            actions=self.actions[rows],
            extras=part(self.extras),
            rewards=self.rewards[rows],
            next_obs=part(self.next_obs),
            terminated=self.terminated[rows],
            truncated=self.truncated[rows],
            next_action_mask=part(self.next_action_mask),
            names=None if self.names is None else [self.names[i] for i in rows],
            matched=part(self.matched),
            reported=part(self.reported),
        )


def _row_names(envs: np.ndarray, names: Optional[list[str]], agent: Optional[str]) -> list[str]:
    return names if names is not None else [f"{agent}:{int(env)}" for env in envs]


_TRANSITION_FIELDS = {f.name for f in fields(Transitions)}


# ---- the body, as the caller writes it ------------------------------------------------------
def step_body(
    envs: Any,
    obs: Any,
    *,
    action_mask: Any = None,
    step_ids: Any = None,
    act: Any = None,
    reset: Optional[Mapping[str, Any]] = None,
    **reported: Any,
) -> dict[str, Any]:
    """A stepColumns body from its columns (arrays or lists; a Dict space's `obs` a dict of
    columns). `reported`: the `REPORTED` fields by their Python names (rewards, terminated,
    truncated, ...); `reset`: {rows, obs, actionMask}; None leaves a field out."""
    known = {f.name: f for f in REPORTED}
    unknown = sorted(set(reported) - set(known))
    if unknown:
        raise TypeError(f"a stepColumns step reports {sorted(known)}, not {unknown}")
    body: dict[str, Any] = {"envs": np.asarray(envs), "obs": as_columns(obs)}
    given = {"action_mask": action_mask, "step_ids": step_ids}
    for name, wire in _ROW_FIELDS:
        if given[name] is not None:
            body[wire] = np.asarray(given[name])
    for f in REPORTED:
        if reported.get(f.name) is not None:
            body[f.wire] = np.asarray(reported[f.name])
    if act is not None:
        body["act"] = np.asarray(act)
    if reset is not None:
        body["reset"] = {
            key: as_columns(value) for key, value in reset.items() if value is not None
        }
    return body


def as_columns(value: Any) -> Columns:
    """A column as an array; a Dict space's (a dict of columns) as a dict of arrays."""
    if isinstance(value, Mapping):
        return {key: np.asarray(column) for key, column in value.items()}
    return np.asarray(value)


# ---- the body, as the service reads it ------------------------------------------------------
class SpaceChecks(Protocol):
    """What the registered spaces allow (the service compiles it once per registration)."""

    def obs_columns(self, value: Any, field: str, rows: int) -> Columns: ...

    def mask_columns(self, value: Any, field: str, rows: int, now: bool = True) -> np.ndarray: ...


class ActedOn(Protocol):
    """What the agent acted on, looked up by step id (`mistk_rl.service.steps`)."""

    obs: Columns
    actions: np.ndarray
    extras: dict[str, np.ndarray]


@dataclass
class ColumnStep:
    """A stepColumns request, checked: who acts on what, and which steps' outcomes came."""

    acting: Optional[Acting]  # None: no row acts
    step_ids: np.ndarray  # [M]: the steps reported
    outcome_envs: np.ndarray  # [M]: their env copies
    reported: dict[str, np.ndarray]  # `REPORTED`'s fields, [M] each
    next_obs: Columns  # [M]: what each reported step led to
    next_mask: Optional[np.ndarray]

    def transitions(self, kept: ActedOn) -> Transitions:
        """The reported steps as transitions, with what the agent acted on in them."""
        core: dict[str, Any] = {k: v for k, v in self.reported.items() if k in _TRANSITION_FIELDS}
        return Transitions(
            envs=self.outcome_envs,
            obs=kept.obs,
            actions=kept.actions,
            extras=kept.extras,
            next_obs=self.next_obs,
            next_action_mask=self.next_mask,
            reported={k: v for k, v in self.reported.items() if k not in _TRANSITION_FIELDS},
            **core,
        )


def read_step(
    body: Mapping[str, Any], checks: SpaceChecks, check_rows: Callable[[int], None]
) -> ColumnStep:
    """A stepColumns body, every column checked (against the spaces through `checks`;
    `check_rows` refuses too many rows); InvalidRequest naming the first field at fault."""
    envs = read_column(body["envs"], "envs", len(body["envs"]), "iu")
    n = len(envs)
    listed = envs.tolist() if envs.ndim == 1 else None  # (a set beats np.unique here)
    if listed is None or (n and min(listed) < 0) or len(set(listed)) != n:
        raise InvalidRequest("envs: one distinct env copy index (>= 0) per row", field="envs")
    check_rows(n)
    obs = checks.obs_columns(body["obs"], "obs", n)
    mask = (
        checks.mask_columns(body["actionMask"], "actionMask", n, now=False)
        if body.get("actionMask") is not None
        else None
    )
    acts = read_flags(body["act"], "act", n) if "act" in body else None  # None: every row
    ids = (
        read_column(body["stepIds"], "stepIds", n, "iu").astype(np.int64, copy=False)
        if "stepIds" in body
        else np.full(n, -1, np.int64)
    )
    outcome_rows = np.flatnonzero(ids >= 0)
    acting_obs, acting_mask = _after_resets(body.get("reset"), obs, mask, n, checks)
    acting = n > 0 if acts is None else bool(acts.any())
    if acting_mask is not None and acting:  # what acting rows pick from must allow one
        allowed = acting_mask if acts is None else acting_mask[acts]
        checks.mask_columns(allowed, "actionMask", len(allowed))
    step = ColumnStep(
        None,
        ids[outcome_rows],
        envs[outcome_rows],
        _read_reported(body, n, outcome_rows),
        take_rows(obs, outcome_rows),
        None if mask is None else mask[outcome_rows],
    )
    if acting:
        rows = slice(None) if acts is None or acts.all() else np.flatnonzero(acts)
        step.acting = Acting(
            envs[rows],
            take_rows(acting_obs, rows),
            None if acting_mask is None else acting_mask[rows],
        )
    return step


def _after_resets(
    reset: Optional[Mapping[str, Any]],
    obs: Columns,
    mask: Optional[np.ndarray],
    n: int,
    checks: SpaceChecks,
) -> tuple[Columns, Optional[np.ndarray]]:
    """What the rows act on: `obs` and `mask`, with the rows whose episode was reset
    replaced by their new episode's first observation and mask."""
    if not reset:
        return obs, mask
    rows = read_column(reset["rows"], "reset.rows", len(reset["rows"]), "iu")
    if rows.ndim != 1 or ((rows < 0) | (rows >= n)).any() or len(np.unique(rows)) != len(rows):
        raise InvalidRequest(f"reset.rows: distinct row indices in [0, {n})", field="reset.rows")
    acting_obs = _replace_rows(obs, rows, checks.obs_columns(reset["obs"], "reset.obs", len(rows)))
    if mask is None:
        return acting_obs, None
    if reset.get("actionMask") is None:
        raise InvalidRequest(
            "reset.actionMask: actionMask is given, so the reset rows need theirs",
            field="reset.actionMask",
        )
    acting_mask = mask.copy()
    acting_mask[rows] = checks.mask_columns(reset["actionMask"], "reset.actionMask", len(rows))
    return acting_obs, acting_mask


def _read_reported(
    body: Mapping[str, Any], n: int, outcome_rows: np.ndarray
) -> dict[str, np.ndarray]:
    """`REPORTED`'s columns, at the rows that report (empty ones when none does)."""
    if not len(outcome_rows):
        return {f.name: np.zeros(0, bool if f.kind == "flag" else np.float64) for f in REPORTED}
    out = {}
    for f in REPORTED:
        if f.wire not in body and not f.required:
            out[f.name] = np.full(len(outcome_rows), f.default)
        elif f.kind == "flag":
            out[f.name] = read_flags(body.get(f.wire, []), f.wire, n)[outcome_rows]
        else:  # (finite where rows report: the others may say anything)
            out[f.name] = read_numbers(body.get(f.wire, []), f.wire, n, outcome_rows)
    return out


# ---- columns, checked -----------------------------------------------------------------------
_KINDS = {"b": "booleans", "biu": "integers", "biuf": "numbers"}


def read_column(
    value: Any, field: str, rows: int, kinds: str = "biuf", dtype: Any = None
) -> np.ndarray:
    """One column: an array (binary body) or nested lists (JSON) of `rows` rows of numbers
    of `kinds`; cast to `dtype` when given (after the checks)."""
    try:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise InvalidRequest(
            f"{field}: not a rectangular array of numbers ({exc})", field=field
        ) from exc
    if array.ndim == 0 or len(array) != rows:
        raise InvalidRequest(
            f"{field}: {0 if array.ndim == 0 else len(array)} rows, where envs has {rows}",
            field=field,
        )
    if array.dtype.kind not in kinds:
        raise InvalidRequest(
            f"{field}: values of dtype {array.dtype}, not {_KINDS.get(kinds, 'numbers')}",
            field=field,
        )
    return array if dtype is None else array.astype(dtype, copy=False)


def read_flags(value: Any, field: str, rows: int) -> np.ndarray:
    """One flag (true/false or 0/1) per row, as bools."""
    array = read_column(value, field, rows, "biu")
    if array.ndim != 1 or (array.dtype.kind != "b" and ((array < 0) | (array > 1)).any()):
        raise InvalidRequest(f"{field}: one flag (true/false or 0/1) per row", field=field)
    return array.astype(bool, copy=False)


def read_numbers(value: Any, field: str, rows: int, at: Optional[np.ndarray] = None) -> np.ndarray:
    """One number per row, as float64; finite at the rows `at` (all rows when None),
    which are the rows returned."""
    array = read_column(value, field, rows).astype(np.float64, copy=False)
    if at is not None:
        array = array[at]
    if array.ndim != 1 or not np.isfinite(array).all():
        raise InvalidRequest(f"{field}: one finite number per row", field=field)
    return array


class RowsView(Mapping):
    """A column as the space checks take it (`mistk_rl.spaces.value_check`): rows keyed by
    their index, all in one `array` (a Dict space's: one per key); a wrong row is named by
    its index."""

    def __init__(self, array: Columns, rows: int) -> None:
        self.array = array
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rows))

    def __getitem__(self, row: int) -> Any:
        if isinstance(self.array, dict):
            return {key: column[row] for key, column in self.array.items()}
        return self.array[row]


def _replace_rows(columns: Columns, rows: np.ndarray, values: Columns) -> Columns:
    """`columns` with `rows` replaced by `values` (a copy)."""
    if isinstance(columns, dict):
        assert isinstance(values, dict)  # (a Dict space's columns, checked alike)
        return {key: _replaced(column, rows, values[key]) for key, column in columns.items()}
    assert isinstance(values, np.ndarray)
    return _replaced(columns, rows, values)


def _replaced(column: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = column.copy()
    out[rows] = values
    return out
