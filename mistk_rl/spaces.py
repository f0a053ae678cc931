"""gymnasium spaces <-> the spec's ``Space`` objects, and actions coerced into a space."""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

SUPPORTED = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def space_to_dict(space: spaces.Space) -> dict[str, Any]:
    """A JSON-ready description of `space`; raises ValueError for unsupported kinds."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _finite(space.low), "high": _finite(space.high)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(),
                "shape": list(space.shape), "dtype": str(space.dtype)}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape)}
    raise ValueError(f"unsupported space {space!r}: use Box, Discrete, MultiDiscrete or "
                     "MultiBinary")


def space_from_dict(data: dict[str, Any]) -> spaces.Space:
    kind = data["type"]
    if kind == "Discrete":
        return spaces.Discrete(int(data["n"]), start=int(data.get("start") or 0))
    if kind == "Box":
        dtype = np.dtype(data.get("dtype") or "float32")
        with np.errstate(over="ignore"):  # bounds sent as float64 max mean +-inf
            low = np.asarray(data["low"], dtype=np.float64).astype(dtype)
            high = np.asarray(data["high"], dtype=np.float64).astype(dtype)
        return spaces.Box(low=low, high=high, shape=tuple(data["shape"]), dtype=dtype)
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(np.asarray(data["nvec"]),
                                    dtype=np.dtype(data.get("dtype") or "int64"))
    if kind == "MultiBinary":
        shape = data["shape"]
        return spaces.MultiBinary(shape[0] if len(shape) == 1 else shape)
    raise ValueError(f"unsupported space type {kind!r}")


def coerce_action(space: spaces.Space, action: Any) -> Any:
    """`action` (as it came over JSON) in the form `space.contains` accepts.

    Raises ValueError naming the space when the action does not belong to it.
    """
    if (type(action) is int or isinstance(action, np.integer)) and isinstance(
            space, spaces.Discrete):  # the common case, once per env step: no arrays
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
