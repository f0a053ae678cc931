"""The binary encoding of the step path (`application/vnd.mistk.tensors`).

JSON spells every number of every entity out as text; with hundreds of env copies per request
that dominates the step. This encoding keeps the JSON shape of a request (maps of entity ->
value, possibly nested, e.g. ``replay.prevObs``) but stores each map as one stacked array:

    [4 bytes: header length, little endian] [header: JSON] [array bytes, back to back]
    header = {"maps": {"obs": {"entities": [...], "dtype": "<f4", "shape": [N, 4],
                               "offset": 0}, "replay.rewards": {...}, ...},
              "values": {"mode": "collect", ...}}   # small non-tensor fields, as JSON

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
_LENGTH = struct.Struct("<I")


class StackedMap(dict):
    """entity -> array, all rows of one stacked `array`: one dtype and one shape, so a
    validator may check a single entry for all of them."""

    array: np.ndarray


def encode(body: Mapping[str, Any]) -> bytes:
    """`body` (maps of entity -> array-like, nested dicts allowed) as one binary message."""
    maps: dict[str, dict] = {}
    values: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    for path, value in _flatten(body):
        if _is_mapping(value):
            entities = list(value)
            array = (np.stack([np.asarray(value[e]) for e in entities]) if entities
                     else np.zeros((0,)))
            if array.dtype == object or array.dtype.kind not in "biuf":
                raise ValueError(f"{path}: values must be numbers or equal-shape arrays")
            array = np.ascontiguousarray(array)
            maps[path] = {"entities": entities, "dtype": array.dtype.str,
                          "shape": list(array.shape), "offset": offset}
            chunks.append(array.tobytes())
            offset += array.nbytes
        else:
            values[path] = value
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
            dtype = np.dtype(meta["dtype"])
            if dtype.kind not in "biuf":
                raise ValueError(f"dtype {dtype} is not numeric")
            shape = tuple(int(n) for n in meta["shape"])
            count = math.prod(shape)
            start = base + int(meta["offset"])
            if start + count * dtype.itemsize > len(data) or len(meta["entities"]) != (
                    shape[0] if shape else 0):
                raise ValueError(f"{path}: shape {shape} does not fit the message")
            array = np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)
            stacked = StackedMap(zip(meta["entities"], array))
            stacked.array = array
            _put(body, path, stacked)
        return body
    except (ValueError, KeyError, TypeError, struct.error, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"malformed {CONTENT_TYPE} body: {exc}") from exc


def _flatten(body: Mapping[str, Any], prefix: str = ""):
    """(dotted path, value) pairs; a dict whose values are all dicts is descended into."""
    for key, value in body.items():
        path = f"{prefix}{key}"
        if _is_mapping(value) and value and all(_is_mapping(v) for v in value.values()):
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
