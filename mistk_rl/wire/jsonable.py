"""JSON for the wire: numpy values turned into JSON-ready Python, and the fast encode and
decode that every request and answer of the SDK and the services goes through."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

# orjson before 3.9.15 recurses without a bound while parsing (CVE-2024-27454: a deep enough
# body overflows the stack); a text with no more brackets than this cannot nest deeper
FAST_DEPTH = 1024


def to_jsonable(value: Any) -> Any:
    """Arrays become nested lists, numpy scalars Python numbers; containers are walked."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def dumps(value: Any) -> bytes:
    """`value` (numpy arrays and scalars in it too) as compact JSON: the numbers
    ``json.dumps(to_jsonable(value))`` writes, by orjson (64 CartPole entities: 7x faster).

    orjson writes NaN and Infinity as null and refuses some of what `json` writes (a key that
    is no string, an integer past 64 bits); such a value, and any whose JSON holds null, is
    written by `json` as before, so a NaN still reaches the service as NaN (which it refuses
    naming the field) and not as a null."""
    try:
        out = orjson.dumps(value, default=_numpy)
    except orjson.JSONEncodeError:
        out = b"null"
    if b"null" in out:
        return json.dumps(to_jsonable(value), separators=(",", ":")).encode()
    return out


def _numpy(value: Any) -> Any:
    # a float32 array goes as the float64 numbers `tolist` gives, as `to_jsonable` sends it
    # (orjson's own numpy support writes float32's shortest digits: 0.7f becomes 0.7, a
    # different float64, past a bound of 0.7f)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def loads_fast(raw: bytes) -> Any:
    """`raw` parsed by orjson (7x faster than `json`); ValueError where orjson refuses it or it
    might nest too deeply for orjson (more than FAST_DEPTH brackets): the caller's `json`
    path then decides, with its own messages (orjson refuses NaN, Infinity, 1e400, invalid
    UTF-8 and a lone surrogate, as strict JSON should; it reads an integer past 64 bits as a
    float)."""
    if len(raw) > FAST_DEPTH and raw.count(b"[") + raw.count(b"{") > FAST_DEPTH:
        raise ValueError(f"more than {FAST_DEPTH} brackets")
    return orjson.loads(raw)
