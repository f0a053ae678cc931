"""gymnasium spaces <-> the spec's ``Space`` objects, actions coerced into a space, and the
checks that observations and actions a caller sends belong to the registered spaces.

A Dict space holds fundamental spaces (`SUPPORTED`) under keys matching `DICT_KEY`; its
observations are dicts with exactly those keys. A Dict inside a Dict is refused: flatten
its keys instead (no env this project serves nests them, and every layer that handles
observations would otherwise have to recurse).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.limits import Limits
from mistk_rl.wire.codec import StackedMap

SUPPORTED = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
# Dict keys, matched whole (a pattern's $ alone would take a trailing newline): the specs'
# DictSpace.spaces say it as x-key-pattern, which their validator checks (a test holds them equal)
DICT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
MAX_DICT_KEYS = 64  # the spec's DictSpace.spaces maxProperties


def space_to_dict(space: spaces.Space) -> dict[str, Any]:
    """A JSON-ready description of `space`; raises ValueError for unsupported kinds."""
    if isinstance(space, spaces.Dict):
        _check_dict_keys(space.spaces)
        return {
            "type": "Dict",
            "spaces": {
                key: _fundamental(sub, key, space_to_dict) for key, sub in space.spaces.items()
            },
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _finite(space.low),
            "high": _finite(space.high),
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape)}
    raise ValueError(
        f"unsupported space {space!r}: use Box, Discrete, MultiDiscrete, "
        "MultiBinary, or a Dict of those"
    )


def space_from_dict(data: dict[str, Any]) -> spaces.Space:
    kind = data["type"]
    if kind == "Dict":
        subspaces = data["spaces"]
        if not isinstance(subspaces, dict) or not subspaces:
            raise ValueError("a Dict space needs at least one subspace in 'spaces'")
        _check_dict_keys(subspaces)
        return spaces.Dict(
            {key: _fundamental(sub, key, space_from_dict) for key, sub in subspaces.items()}
        )
    if kind == "Discrete":
        n, start = int(data["n"]), int(data.get("start") or 0)
        if start < _INT64.min or start + n - 1 > _INT64.max:
            raise ValueError(f"Discrete n={n} start={start}: its actions do not fit int64")
        return spaces.Discrete(n, start=start)
    if kind == "Box":
        dtype = np.dtype(data.get("dtype") or "float32")
        low, high = (_bound(data[key], dtype, key) for key in ("low", "high"))
        return spaces.Box(low=low, high=high, shape=tuple(data["shape"]), dtype=dtype)
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(
            np.asarray(data["nvec"]), dtype=np.dtype(data.get("dtype") or "int64")
        )
    if kind == "MultiBinary":
        shape = data["shape"]
        return spaces.MultiBinary(shape[0] if len(shape) == 1 else shape)
    raise ValueError(f"unsupported space type {kind!r}")


_INT64 = np.iinfo(np.int64)


def _bound(value: Any, dtype: np.dtype, what: str) -> np.ndarray:
    """A Box bound as an array of `dtype`. A float bound past the dtype's range is +-inf
    (bounds sent as float64's max mean that). An integer dtype's bounds must be integers it
    holds (a cast would wrap them: 1000 in int8 is -24, and 2**63-1 through float64 is
    -2**63), below int64's max (gymnasium samples an integer Box through int64, high + 1)."""
    if dtype.kind not in "iu":
        with np.errstate(over="ignore"):
            return np.asarray(value, dtype=np.float64).astype(dtype)
    info = np.iinfo(dtype)
    lowest, highest = max(int(info.min), int(_INT64.min)), min(int(info.max), int(_INT64.max) - 1)
    bound = np.asarray(value)
    if bound.dtype.kind == "f":
        if not (np.isfinite(bound).all() and (bound == np.round(bound)).all()):
            raise ValueError(f"Box {what} of dtype {dtype} must be finite integers")
        # (a float past 2**53 is an integer; as an int it is exact)
        values = [int(bound.min()), int(bound.max())] if bound.size else []
    elif bound.dtype.kind in "iu" or (
        bound.dtype == object and all(type(v) is int for v in bound.ravel().tolist())
    ):  # (object: past 64 bits)
        values = [int(bound.min()), int(bound.max())] if bound.size else []
    else:
        raise ValueError(f"Box {what} holds {bound.dtype} values, not numbers")
    if any(v < lowest or v > highest for v in values):
        raise ValueError(
            f"Box {what} holds a number outside {lowest}..{highest}, what a Box of {dtype} can have"
        )
    return bound.astype(dtype)


def _check_dict_keys(subspaces: Mapping[str, Any]) -> None:
    if len(subspaces) > MAX_DICT_KEYS:
        raise ValueError(f"a Dict space has {len(subspaces)} keys, at most {MAX_DICT_KEYS}")
    for key in subspaces:
        if not isinstance(key, str) or not DICT_KEY.fullmatch(key):
            raise ValueError(f"Dict key {key!r} does not match {DICT_KEY.pattern}")


def _fundamental(sub: Any, key: str, convert: Callable[[Any], Any]) -> Any:
    """`convert(sub)` for a Dict's subspace `sub` (a gymnasium space or its description),
    which must be a fundamental one."""
    if isinstance(sub, spaces.Dict) or (isinstance(sub, Mapping) and sub.get("type") == "Dict"):
        raise ValueError(
            f"Dict key {key!r} holds a Dict: a Dict inside a Dict is not "
            "supported (flatten its keys)"
        )
    try:
        return convert(sub)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"Dict key {key!r}: {exc}") from exc


def coerce_action(space: spaces.Space, action: Any) -> Any:
    """`action` (as it came over JSON) in the form `space.contains` accepts.

    Raises ValueError naming the space when the action does not belong to it.
    """
    if (type(action) is int or isinstance(action, np.integer)) and isinstance(
        space, spaces.Discrete
    ):  # the common case, once per env step: no arrays
        if space.start <= action < space.start + space.n:
            return np.int64(action)
        raise ValueError(f"action {action!r} is not in the action space {space}")
    try:
        if isinstance(space, spaces.Discrete):
            value = np.asarray(action)
            if value.size != 1 or value.reshape(()) != np.round(value.reshape(())):
                raise ValueError
            coerced: Any = np.int64(value.reshape(()))
        else:
            coerced = np.asarray(action, dtype=space.dtype).reshape(space.shape)
    except (ValueError, TypeError):
        coerced = None
    if coerced is None or not space.contains(coerced):
        raise ValueError(f"action {action!r} is not in the action space {space}")
    return coerced


def _finite(bound: np.ndarray) -> Any:
    """Bounds as lists; infinities become the dtype's largest float (JSON has no inf)."""
    limit = float(np.finfo(np.float64).max) if bound.dtype.kind == "f" else None
    values = bound.astype(np.float64)
    if limit is not None:
        values = np.clip(values, -limit, limit)
    return values.tolist()


def space_elements(data: Mapping[str, Any]) -> int:
    """The numbers one value of the space described by `data` holds, or one encoding of a
    value (a Dict's: all its keys'), computed from the description alone, so that a limit can
    refuse a huge space before anything is allocated. A Discrete(n) counts n: its action
    masks, one-hot encodings and a policy's outputs for it hold n numbers (the mask check
    alone would allocate n flags); a MultiDiscrete counts sum(nvec) where that is more than
    its values' numbers (its masks and one-hot encodings); an axis of length 0 counts as 1,
    so no axis is ever longer than the limit. Raises ValueError for a description whose
    sizes are not numbers (a ragged ``nvec``, text)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a space is an object, not {type(data).__name__}")
    kind = data.get("type")
    if kind == "Discrete":
        if "n" not in data:
            raise ValueError("a Discrete space needs 'n'")
        return _size(data["n"], "n")
    if kind == "Dict" and isinstance(data.get("spaces"), Mapping):
        return sum(
            space_elements(sub) for sub in data["spaces"].values() if isinstance(sub, Mapping)
        )
    shape = data.get("shape")
    counts = 0
    if kind == "MultiDiscrete" and data.get("nvec") is not None:
        nvec = np.asarray(data["nvec"])  # ragged: ValueError; past int64: object
        if nvec.dtype.kind not in "iufO":
            raise ValueError(f"nvec holds {nvec.dtype} values, not counts")
        counts = sum(_size(n, "an nvec entry") for n in nvec.ravel().tolist())
        if shape is None:
            shape = nvec.shape
    axes = [_size(n, "a shape entry") for n in (shape or ())]
    return max(math.prod(max(n, 1) for n in axes), counts)


def _size(value: Any, what: str) -> int:
    """A count from a space's description (an int, or a float without a fraction); 0 for
    one below 0, which the space itself refuses."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} {value!r} is not an integer")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{what} {value!r} is not an integer")
    return max(int(value), 0)


def space_from_request(data: Any, limits: Limits, field: str) -> spaces.Space:
    """The space a request describes in `field`: its size (`space_elements`) checked against
    the max_space_elements limit from the description alone, then the space built.
    InvalidRequest (400) names the limit, or the field and what is wrong with the space."""
    try:
        limits.check(
            "max_space_elements",
            space_elements(data),
            f"{field}: the count of numbers in one value (or its mask or one-hot encoding)",
        )
        return space_from_dict(data)
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise InvalidRequest(f"{field} is not a valid space: {exc}", field=field) from exc


ValueCheck = Callable[[Mapping[str, Any], str], None]


def value_check(space: Optional[spaces.Space], what: str, float_bounds: bool = True) -> ValueCheck:
    """A check that every entity's value (numpy arrays, as handlers hold them; for a Dict
    space a dict of them) belongs to `space`: shape, kind of number, finite, inside finite
    bounds; a Dict's value has exactly its keys. Raises InvalidRequest naming the field, the
    entity (and key) and what is wrong. A stacked map (the binary encoding's, or many
    entities stacked) is checked in one pass over its array (a Dict's: over each key's). No
    space (an agent registered without one): no check.

    `float_bounds=False` skips the bounds of a float Box (still finite): for observations,
    whose bounds envs do not keep (LunarLander-v3's velocities leave theirs; gymnasium's
    checker only warns). Integer Boxes and discrete spaces keep their ranges: a value outside
    cannot be cast to the dtype or used as an index."""
    if space is None:
        return lambda values, field: None
    if isinstance(space, spaces.Dict):
        return _dict_check(space, what, float_bounds)
    return _array_check(space, what, float_bounds)


def _array_check(
    space: spaces.Space, what: str, float_bounds: bool, key: Optional[str] = None
) -> ValueCheck:
    """`value_check` for a fundamental space (`key`: the Dict key it sits under)."""
    describe = f"{what} {space}" if key is None else f"{what} {space} at key {key!r}"
    at = "" if key is None else f"[{key!r}]"
    if not float_bounds and isinstance(space, spaces.Box) and space.dtype.kind not in "iu":
        space = spaces.Box(-np.inf, np.inf, space.shape, space.dtype)
    shape, test = _rule(space)

    def check(values: Mapping[str, Any], field: str) -> None:
        stacked = getattr(values, "array", None)  # all entities' values as one array's rows
        if isinstance(stacked, np.ndarray):
            problem = _problem(stacked, shape, test, stacked=True)
            if not problem:
                return
            if len(stacked) != len(values):
                raise InvalidRequest(f"{field}: {problem} ({describe})", field=field)
            values = dict(zip(values, stacked))  # a row is wrong: find it to name it
        for entity, value in values.items():
            problem = (
                "an object with keys, where one Tensor is expected"
                if isinstance(value, Mapping)
                else _problem(np.asarray(value), shape, test, stacked=False)
            )
            if problem:
                raise InvalidRequest(
                    f"{field}[{entity!r}]{at}: {problem} ({describe})",
                    field=field,
                    entity=entity,
                    **({} if key is None else {"key": key}),
                )

    return check


def _dict_check(space: spaces.Dict, what: str, float_bounds: bool) -> ValueCheck:
    """`value_check` for a Dict space: each entity's value a dict with exactly its keys, each
    key's values checked as its subspace's (one pass per key over a stacked map)."""
    keys = list(space.spaces)
    checks = {key: _array_check(sub, what, float_bounds, key) for key, sub in space.spaces.items()}
    describe = f"{what} a Dict with keys {keys}"

    def check(values: Mapping[str, Any], field: str) -> None:
        stacked = getattr(values, "array", None)
        if isinstance(stacked, dict) and stacked.keys() == checks.keys():
            for key, array in stacked.items():
                column = StackedMap(zip(values, array))
                column.array = array
                checks[key](column, field)
            return
        for entity, value in values.items():
            if not isinstance(value, Mapping):
                raise InvalidRequest(
                    f"{field}[{entity!r}]: one Tensor, where an object with "
                    f"one Tensor per key is expected ({describe})",
                    field=field,
                    entity=entity,
                )
            if value.keys() != checks.keys():
                missing = [k for k in keys if k not in value]
                extra = [k for k in value if k not in checks]
                problems = ([f"missing key(s) {missing}"] if missing else []) + (
                    [f"unexpected key(s) {extra}"] if extra else []
                )
                raise InvalidRequest(
                    f"{field}[{entity!r}]: {'; '.join(problems)} ({describe})",
                    field=field,
                    entity=entity,
                )
        for key, key_check in checks.items():
            key_check({entity: value[key] for entity, value in values.items()}, field)

    return check


def observation_dtypes(space: Optional[spaces.Space]) -> Optional[dict[str, np.dtype]]:
    """A Dict space's dtype per key: what its observations are cast to once checked, so
    that uint8 planes sent as JSON numbers are uint8 again. None for other spaces (their
    observations stay as they came)."""
    if not isinstance(space, spaces.Dict):
        return None
    return {key: np.dtype(sub.dtype) for key, sub in space.spaces.items()}


def mask_check(space: Optional[spaces.Space], allows_some: bool = True) -> ValueCheck:
    """Action masks: one flag per action of a Discrete space. `allows_some`: each entity's
    mask must allow at least one action (a mask of the actions to pick from now: with none
    allowed there is no action to answer with); a replayed ``newActionMask`` may allow none
    (the episode is over: the game orchestrator sends zeros then)."""
    if not isinstance(space, spaces.Discrete):
        return lambda values, field: None
    flags = value_check(spaces.MultiBinary(int(space.n)), "a mask for")
    if not allows_some:
        return flags
    describe = f"a mask for {space}"

    def check(values: Mapping[str, Any], field: str) -> None:
        flags(values, field)  # (shape and 0/1 first: the rows below are flags)
        stacked = getattr(values, "array", None)
        rows: Iterable[tuple[str, Any]]
        if isinstance(stacked, np.ndarray) and len(stacked) == len(values):
            allowed = np.asarray(stacked.reshape(len(stacked), -1).any(axis=1))  # one call
            rows = [] if allowed.all() else [(e, a) for e, a in zip(values, allowed)]
        else:
            rows = values.items()
        for entity, row in rows:
            if not np.asarray(row).any():
                raise InvalidRequest(
                    f"{field}[{entity!r}]: the mask allows no action "
                    f"({describe}: at least one flag must be 1)",
                    field=field,
                    entity=entity,
                )

    return check


def _rule(space: spaces.Space) -> tuple[tuple[int, ...], Callable[[np.ndarray], str]]:
    """(shape, test): the test returns what is wrong with an array of the right shape."""
    if isinstance(space, spaces.Discrete):
        first, last = int(space.start), int(space.start + space.n - 1)
        return (), _in_range(np.full((), first), np.full((), last), integral=True)
    if isinstance(space, spaces.MultiDiscrete):
        low = np.broadcast_to(getattr(space, "start", 0), space.shape)
        return space.shape, _in_range(low, low + space.nvec - 1, integral=True)
    if isinstance(space, spaces.MultiBinary):
        shape = tuple(space.shape)
        return shape, _in_range(np.zeros(shape), np.ones(shape), integral=True)
    if isinstance(space, spaces.Box):
        return space.shape, _in_range(space.low, space.high, space.dtype.kind in "iu")
    raise ValueError(f"unsupported space {space!r}")


def _in_range(low: np.ndarray, high: np.ndarray, integral: bool) -> Callable[[np.ndarray], str]:
    """A test that every number of an array (one value, or rows of values) is finite, inside
    the finite bounds, and integral where the space is. Infinite bounds become the largest
    float, so one comparison also refuses NaN and infinities. One value of up to 64 numbers
    (the per-step case) is compared in plain Python: each numpy call costs microseconds,
    which measured +30 us per getAction round trip."""
    biggest = float(np.finfo(np.float64).max)
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    low, high = (
        np.where(np.isfinite(low), low, -biggest),
        np.where(np.isfinite(high), high, biggest),
    )
    low_list, high_list = low.ravel().tolist(), high.ravel().tolist()
    small = low.size <= 64

    def test(a: np.ndarray) -> str:
        kind = a.dtype.kind
        if kind not in "biuf":
            return f"a value of dtype {a.dtype} is not a number"
        if small and a.size == len(low_list):  # one value: plain Python
            values = a.ravel().tolist()
            if all(lo <= v <= hi for v, lo, hi in zip(values, low_list, high_list)) and (
                not integral or kind != "f" or all(v == int(v) for v in values)
            ):
                return ""
        if kind == "f" and not np.isfinite(a).all():
            return "not every number is finite"
        if integral and kind == "f" and (a != np.round(a)).any():
            return f"a value of dtype {a.dtype} is not integral"
        if ((a < low) | (a > high)).any():
            return "a value is outside the " + ("space" if integral else "bounds")
        return ""

    return test


def _problem(
    a: np.ndarray, shape: tuple[int, ...], test: Callable[[np.ndarray], str], stacked: bool
) -> str:
    got = a.shape[1:] if stacked else a.shape
    if got != tuple(shape) and not (shape == () and got == (1,)):
        return f"shape {got} is not {tuple(shape)}"
    return test(a)
