"""The binary encoding of the step path (`application/vnd.mistk.tensors`).

JSON spells every number of every entity out as text; with hundreds of env copies per request
that dominates the step. This encoding keeps the JSON shape of a request (maps of entity ->
value, in the body or in a `CONTAINERS` field, e.g. ``replay.prevObs``) but stores each map
as one stacked array, and a map of dict observations (entity -> {key: value}) as one stacked
array per key, each with its own dtype (uint8 planes stay uint8 next to float vectors):

    [4 bytes: header length, little endian] [header: JSON] [array bytes, back to back]
    header = {"maps": {"obs": {"entities": [...], "dtype": "<f4", "shape": [N, 4],
                               "offset": 0}, "replay.rewards": {...}, ...},
              "values": {"mode": "collect", ...}}   # small non-tensor fields, as JSON
    a map of dict observations: {"entities": [...], "keys": {"planes": {"dtype": "|u1",
                                 "shape": [N, 4, 7, 7], "offset": 0}, ...}}

Decoding gives the same dict a JSON body would, with numpy arrays (views into the body, no
copy) as values, so handlers do not care which encoding arrived.
"""
from __future__ import annotations

import json
import math
import struct
from typing import Any, Mapping

import numpy as np

from mistk_rl.errors import InvalidRequest

CONTENT_TYPE = "application/vnd.mistk.tensors"
# fields that group maps (a step request's replay); every other dict in a body is a map of
# entity -> value. The structure alone cannot tell them apart: {"prevObs": {e: obs}} has the
# shape of a map of dict observations {e: {key: value}}
CONTAINERS = frozenset({"replay"})
_LENGTH = struct.Struct("<I")


class StackedMap(dict):
    """entity -> array, all rows of one stacked `array`: one dtype and one shape, so a
    validator may check a single entry for all of them. For dict observations, entity ->
    {key: row} and `array` holds one stacked array per key."""

    array: np.ndarray | dict[str, np.ndarray]


def encode(body: Mapping[str, Any]) -> bytes:
    """`body` (maps of entity -> array-like or dict of array-likes, in the body or in its
    `CONTAINERS`) as one binary message."""
    maps: dict[str, dict] = {}
    values: dict[str, Any] = {}
    chunks: list[bytes] = []

    def put(column: list, path: str) -> dict:
        """Stack one value per entity into the message; its header entry."""
        array = np.stack([np.asarray(v) for v in column]) if column else np.zeros((0,))
        if array.dtype == object or array.dtype.kind not in "biuf":
            raise ValueError(f"{path}: values must be numbers or equal-shape arrays")
        array = np.ascontiguousarray(array)
        meta = {"dtype": array.dtype.str, "shape": list(array.shape),
                "offset": sum(len(c) for c in chunks)}
        chunks.append(array.tobytes())
        return meta

    for path, value in _flatten(body):
        if not _is_mapping(value):
            values[path] = value
            continue
        entities = list(value)
        if entities and _is_mapping(value[entities[0]]):  # dict observations
            keys = list(value[entities[0]])
            if any(not _is_mapping(value[e]) or value[e].keys() != set(keys)
                   for e in entities):
                raise ValueError(f"{path}: dict observations of one map must have the same "
                                 "keys")
            maps[path] = {"entities": entities,
                          "keys": {key: put([value[e][key] for e in entities], f"{path}.{key}")
                                   for key in keys}}
        else:
            maps[path] = {"entities": entities, **put([value[e] for e in entities], path)}
    header = json.dumps({"maps": maps, "values": values}).encode()
    return _LENGTH.pack(len(header)) + header + b"".join(chunks)


def decode(data: bytes) -> dict[str, Any]:
    """The body `encode` was given, with each entity's value a numpy array (a view)."""
    try:
        (length,) = _LENGTH.unpack_from(data, 0)
        header = json.loads(data[_LENGTH.size:_LENGTH.size + length])
        base = _LENGTH.size + length
        body: dict[str, Any] = {}
        for path, value in header.get("values", {}).items():
            _put(body, path, value)
        for path, meta in header["maps"].items():
            entities = meta["entities"]
            if "keys" in meta:  # dict observations: one array per key
                arrays = {key: _array(data, base, part, len(entities), f"{path}.{key}")
                          for key, part in meta["keys"].items()}
                if not arrays:
                    raise ValueError(f"{path}: dict observations without keys")
                stacked = StackedMap((entity, {key: a[i] for key, a in arrays.items()})
                                     for i, entity in enumerate(entities))
                stacked.array = arrays
            else:
                array = _array(data, base, meta, len(entities), path)
                stacked = StackedMap(zip(entities, array))
                stacked.array = array
            _put(body, path, stacked)
        return body
    except (ValueError, KeyError, TypeError, struct.error, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"malformed {CONTENT_TYPE} body: {exc}") from exc


def _array(data: bytes, base: int, meta: dict, rows: int, path: str) -> np.ndarray:
    """The stacked array `meta` describes (a view into `data`), of `rows` rows."""
    dtype = np.dtype(meta["dtype"])
    if dtype.kind not in "biuf":
        raise ValueError(f"dtype {dtype} is not numeric")
    shape = tuple(int(n) for n in meta["shape"])
    count = math.prod(shape)
    start = base + int(meta["offset"])
    if start < base or start + count * dtype.itemsize > len(data) or rows != (
            shape[0] if shape else 0):
        raise ValueError(f"{path}: shape {shape} does not fit the message")
    return np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)


def _flatten(body: Mapping[str, Any], prefix: str = ""):
    """(dotted path, value) pairs; the `CONTAINERS` are descended into."""
    for key, value in body.items():
        path = f"{prefix}{key}"
        if path in CONTAINERS and _is_mapping(value) and value:
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # the cheap check first


def _put(body: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        body = body.setdefault(key, {})
    body[leaf] = value
