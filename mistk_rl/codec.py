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

Columns (`stepColumns`: one array per field, rows = env copies) are encoded with
``encode(body, columns=True)``: every numpy array in the body, at any depth (``obs``,
``obs.planes`` for a Dict space's key, ``reset.rows``), is one entry of ``arrays``; an
integer vector that counts up by one (env indices, step ids) travels as its first value,
and a bool array (flags, masks) as a bit per value (numpy's packbits order):

    header = {"arrays": {"obs": {"dtype": "<f4", "shape": [N, 4], "offset": 0},
                         "stepIds": {"dtype": "<i8", "shape": [N], "range": 1024},
                         "terminated": {"dtype": "|b1", "shape": [N], "offset": 16 N,
                                        "packed": true}}, ...}

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
from mistk_rl.jsonable import dumps, loads_fast

CONTENT_TYPE = "application/vnd.mistk.tensors"
# fields that group maps (a step request's replay); every other dict in a body is a map of
# entity -> value. The structure alone cannot tell them apart: {"prevObs": {e: obs}} has the
# shape of a map of dict observations {e: {key: value}}
CONTAINERS = frozenset({"replay"})
_LENGTH = struct.Struct("<I")
# column form: bool arrays of more values travel as bits (flags, masks); below it the
# header's "packed": true costs more bytes than packing saves
PACK_FROM = 16


class StackedMap(dict):
    """entity -> array, all rows of one stacked `array`: one dtype and one shape, so a
    validator may check a single entry for all of them. For dict observations, entity ->
    {key: row} and `array` holds one stacked array per key."""

    array: np.ndarray | dict[str, np.ndarray]


def encode(body: Mapping[str, Any], columns: bool = False) -> bytes:
    """`body` (maps of entity -> array-like or dict of array-likes, in the body or in its
    `CONTAINERS`) as one binary message; with `columns`, a body of numpy arrays at any
    depth (module doc)."""
    if columns:
        return _encode_columns(body)
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


def _encode_columns(body: Mapping[str, Any]) -> bytes:
    arrays: dict[str, dict] = {}
    values: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        nonlocal offset
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, np.ndarray):
                if value.dtype.kind not in "biuf":
                    raise ValueError(f"{path}: an array of dtype {value.dtype}, not numbers")
                start = _range_start(value)
                if start is not None:
                    arrays[path] = {"dtype": value.dtype.str, "shape": [len(value)],
                                    "range": start}
                    continue
                meta = {"dtype": value.dtype.str, "shape": list(value.shape),
                        "offset": offset}
                if value.dtype.kind == "b" and value.size > PACK_FROM:  # a bit each
                    raw = np.packbits(value.reshape(-1)).tobytes()
                    meta["packed"] = True
                else:
                    raw = np.ascontiguousarray(value).tobytes()
                arrays[path] = meta
                chunks.append(raw)
                offset += len(raw)
            elif _is_mapping(value) and _holds_arrays(value):
                walk(value, path + ".")
            else:  # (a mapping without arrays, e.g. a config, goes whole)
                values[path] = value
    walk(body, "")
    header = dumps({"arrays": arrays, "values": values})  # (orjson: compact, fast)
    return _LENGTH.pack(len(header)) + header + b"".join(chunks)


def _holds_arrays(node: Mapping[str, Any]) -> bool:
    return any(isinstance(v, np.ndarray) or (_is_mapping(v) and _holds_arrays(v))
               for v in node.values())


def _range_start(array: np.ndarray) -> int | None:
    """The first value of an integer vector that counts up by one, else None."""
    if array.ndim != 1 or len(array) < 2 or array.dtype.kind not in "iu":
        return None
    first = int(array[0])
    if int(array[-1]) - first != len(array) - 1 or not (np.diff(array) == 1).all():
        return None
    return first


def decode(data: bytes) -> dict[str, Any]:
    """The body `encode` was given, with each entity's value a numpy array (a view).

    Anything that is not such a message (a header length past the body, a header that is not
    the JSON object above, maps or array specs of the wrong kinds, arrays that do not fit
    the body) raises InvalidRequest saying the encoding is malformed."""
    try:
        return _decode(data)
    except (ValueError, KeyError, TypeError, struct.error, RecursionError) as exc:
        # (ValueError covers bad JSON and UTF-8; RecursionError a header nested too deep)
        raise InvalidRequest(f"malformed {CONTENT_TYPE} body: {exc}") from exc


def _decode(data: bytes) -> dict[str, Any]:
    if len(data) < _LENGTH.size:
        raise ValueError(f"{len(data)} bytes, too short for the header length "
                         f"({_LENGTH.size} bytes)")
    (length,) = _LENGTH.unpack_from(data, 0)
    base = _LENGTH.size + length
    if base > len(data):
        raise ValueError(f"the header length {length} runs past the body "
                         f"({len(data) - _LENGTH.size} bytes after it)")
    header = _object(_loads(bytes(data[_LENGTH.size:base])), "the header",
                     optional=("maps", "arrays", "values"))
    if "arrays" in header:  # columns
        if "maps" in header:
            raise ValueError("the header has both maps (entities) and arrays (columns)")
        return _decode_columns(data, base, header)
    if "maps" not in header:
        raise ValueError("the header lacks 'maps'")
    body: dict[str, Any] = {}
    for path, value in _object(header.get("values", {}), "the header's values").items():
        _put(body, path, value)
    for path, meta in _object(header["maps"], "the header's maps").items():
        where = f"maps[{path!r}]"
        if isinstance(meta, dict) and "keys" in meta:  # dict observations: one array per key
            meta = _object(meta, where, required=("entities", "keys"), optional=())
            entities = _entities(meta["entities"], where)
            parts = _object(meta["keys"], f"{where}.keys")
            if not parts:
                raise ValueError(f"{where}: dict observations without keys")
            arrays = {key: _array(data, base, part, len(entities), f"{where}.keys[{key!r}]",
                                  also=())
                      for key, part in parts.items()}
            stacked = StackedMap((entity, {key: a[i] for key, a in arrays.items()})
                                 for i, entity in enumerate(entities))
            stacked.array = arrays
        else:
            entities = _entities(_object(meta, where, required=("entities",))["entities"],
                                 where)
            array = _array(data, base, meta, len(entities), where)
            stacked = StackedMap(zip(entities, array))
            stacked.array = array
        _put(body, path, stacked)
    return body


MAX_COLUMN_DEPTH = 3  # reset.obs.planes


def _decode_columns(data: bytes, base: int, header: dict) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for path, value in _object(header.get("values", {}), "the header's values").items():
        _put_column(body, path, value)
    for path, meta in _object(header["arrays"], "the header's arrays").items():
        where = f"arrays[{path!r}]"
        if isinstance(meta, dict) and "range" in meta:
            meta = _object(meta, where, required=("dtype", "shape", "range"), optional=())
            dtype = np.dtype(_dtype_string(meta["dtype"], where))
            shape = meta["shape"]
            start = meta["range"]
            if dtype.kind not in "iu" or type(start) is not int or type(shape) is not list \
                    or len(shape) != 1:
                raise ValueError(f"{where}: a range is an integer vector: dtype, [length], "
                                 "first value")
            length = _count(shape[0], f"{where}.shape entry")
            array = np.arange(start, start + length, dtype=np.int64)
            if length and (array[-1] > np.iinfo(dtype).max or start < np.iinfo(dtype).min):
                raise ValueError(f"{where}: the range does not fit {dtype}")
            _put_column(body, path, array.astype(dtype))
            continue
        _put_column(body, path, _array(data, base, meta, None, where, also=("packed",)))
    return body


def _dtype_string(value: Any, where: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{where}.dtype {value!r} is not a dtype string")
    return value


def _put_column(body: dict, path: str, value: Any) -> None:
    """`body[a][b][c] = value` for path ``a.b.c`` (at most `MAX_COLUMN_DEPTH` parts)."""
    parts = path.split(".")
    if not all(parts) or len(parts) > MAX_COLUMN_DEPTH:
        raise ValueError(f"{path!r} is not a field path of at most {MAX_COLUMN_DEPTH} parts")
    _set(body, path, parts, value)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} in the header is not a JSON number")


_HEADER = json.JSONDecoder(parse_constant=_no_constant)


def _loads(raw: bytes) -> Any:
    """A header's JSON: orjson (a tenth of `json`'s time on a step's header), else `json`,
    which refuses NaN and Infinity as orjson does and gives its own message."""
    try:
        return loads_fast(raw)
    except ValueError:
        return _HEADER.decode(raw.decode("utf-8"))


_ARRAY_FIELDS = ("dtype", "shape", "offset")


def _object(value: Any, what: str, required: tuple[str, ...] = (),
            optional: tuple[str, ...] | None = None) -> dict:
    """`value` if it is a JSON object with the `required` keys (and, where `optional` is
    given, no keys beyond those two); else ValueError naming `what`."""
    if type(value) is not dict:
        raise ValueError(f"{what} is a {type(value).__name__}, not an object")
    missing = [key for key in required if key not in value]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(map(repr, missing))}")
    if optional is not None:
        extra = [key for key in value if key not in required and key not in optional]
        if extra:
            raise ValueError(f"{what} has unexpected {', '.join(map(repr, extra))}")
    return value


def _entities(value: Any, where: str) -> list[str]:
    if type(value) is not list or not all(type(e) is str for e in value):
        raise ValueError(f"{where}.entities is not a list of names")
    if len(set(value)) != len(value):
        raise ValueError(f"{where}.entities names an entity twice")
    return value


def _count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} {value!r} is not a non-negative integer")
    return value


def _array(data: bytes, base: int, meta: dict, rows: int | None, where: str,
           also: tuple[str, ...] = ("entities",)) -> np.ndarray:
    """The stacked array `meta` describes (a view into `data`), of `rows` rows (None: a
    column, any number; `also`: the keys `meta` may hold besides the array's)."""
    meta = _object(meta, where, required=_ARRAY_FIELDS, optional=also)
    if type(meta["dtype"]) is not str:
        raise ValueError(f"{where}.dtype {meta['dtype']!r} is not a dtype string")
    dtype = np.dtype(meta["dtype"])
    if dtype.kind not in "biuf":
        raise ValueError(f"{where}.dtype {dtype} is not numeric")
    if type(meta["shape"]) is not list or not meta["shape"]:
        raise ValueError(f"{where}.shape {meta['shape']!r} is not a list of one length per "
                         "axis, rows first")
    shape = tuple(_count(n, f"{where}.shape entry") for n in meta["shape"])
    start = base + _count(meta["offset"], f"{where}.offset")
    count = math.prod(shape)
    if rows is not None and shape[0] != rows:
        raise ValueError(f"{where}: {shape[0]} rows for {rows} entities")
    packed = meta.get("packed", False)
    if packed is not False and (packed is not True or dtype.kind != "b"):
        raise ValueError(f"{where}.packed: true, for a bool array (a bit per value)")
    size = -(-count // 8) if packed else count * dtype.itemsize
    if start + size > len(data):
        raise ValueError(f"{where}: shape {shape} of {dtype} at offset {meta['offset']} runs "
                         "past the body")
    if packed:
        bits = np.frombuffer(data, dtype=np.uint8, count=size, offset=start)
        return np.unpackbits(bits, count=count).view(bool).reshape(shape)
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
    """`body[path] = value` for a field path as `_flatten` makes them: a field, or one in a
    container (``replay.prevObs``)."""
    parts = path.split(".")
    if not all(parts) or len(parts) > 2 or (len(parts) == 2 and parts[0] not in CONTAINERS):
        raise ValueError(f"{path!r} is not a field path (a field, or one inside "
                         f"{', '.join(sorted(CONTAINERS))})")
    _set(body, path, parts, value)


def _set(body: dict, path: str, parts: list[str], value: Any) -> None:
    """Put `value` at `parts` in `body`, never over another field or inside one."""
    *parents, leaf = parts
    for key in parents:
        body = body.setdefault(key, {})
        if type(body) is not dict:
            raise ValueError(f"{path!r} is inside {key!r}, which is not an object")
    if leaf in body:
        raise ValueError(f"{path!r} is given twice")
    body[leaf] = value


def pack_arrays(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Named arrays as the wire carries weights: the names and shapes, and all values in one
    float32 vector (parameter names hold dots, which field paths cannot)."""
    return {"names": list(arrays), "shapes": [list(a.shape) for a in arrays.values()],
            "values": np.concatenate([np.asarray(a, np.float32).reshape(-1)
                                      for a in arrays.values()]) if arrays
            else np.zeros(0, np.float32)}


def unpack_arrays(wire: dict[str, Any]) -> dict[str, np.ndarray]:
    """`pack_arrays`' inverse; a ValueError when the shapes do not add up to the values."""
    values = np.asarray(wire["values"], np.float32).reshape(-1)
    sizes = [int(np.prod(shape)) for shape in wire["shapes"]]
    if len(wire["names"]) != len(sizes) or sum(sizes) != len(values):
        raise ValueError("weights: names, shapes and values do not agree")
    parts = np.split(values, np.cumsum(sizes)[:-1]) if sizes else []
    return {name: part.reshape(shape)
            for name, part, shape in zip(wire["names"], parts, wire["shapes"])}
