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
``obs.planes`` for a Dict space's key, ``reset.rows``), is one array of the message, and the
header is binary, a few bytes per array (a step of 64 CartPole copies: 115 bytes, where a
JSON header took 473):

    b"MTC\xff"          (read as an entity-form header length, about 4 GiB: no body is)
    varint: the number of arrays, then for each:
        varint + UTF-8: its field path ("obs", "reset.obs")
        byte: its dtype, an index into DTYPES; byte: its form (below)
        varint: its number of axes, then a varint per axis
        RANGE: a zigzag varint, the first value; FILL: the one value's bytes
    varint + JSON: the body's other values ({} as length 0)
    the arrays' bytes, back to back in header order (BYTES and BITS only)

Varints are LEB128 (7 bits a byte, low first). The forms: BYTES, the values row-major;
BITS, a bool array of more than `PACK_FROM` values, a bit each (numpy's packbits order);
RANGE, an integer vector that counts up by one (env indices, step ids): its first value;
FILL, an array whose values are all the same, bit for bit (a step's rewards in CartPole or
in a sparse-reward game, truncated flags, masks that allow everything): that value once.

Decoding gives the same dict a JSON body would, with numpy arrays (views into the body, no
copy; ranges and fills are made anew, at most `MAX_EXPANDED_BYTES` a message) as values, so
handlers do not care which encoding arrived.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import struct
from typing import Any, Iterator, Mapping, NamedTuple

import numpy as np

from mistk_rl.errors import InvalidRequest
from mistk_rl.wire.jsonable import dumps, loads_fast

CONTENT_TYPE = "application/vnd.mistk.tensors"
# fields that group maps (a step request's replay); every other dict in a body is a map of
# entity -> value. The structure alone cannot tell them apart: {"prevObs": {e: obs}} has the
# shape of a map of dict observations {e: {key: value}}
CONTAINERS = frozenset({"replay"})
_LENGTH = struct.Struct("<I")
# column form: bool arrays of more values travel as bits (flags, masks); below it the few
# bytes saved are not worth packing and unpacking (a microsecond or two an array)
PACK_FROM = 16
COLUMNS_MAGIC = b"MTC\xff"
# a column's dtype travels as its index here (little-endian, as numpy names them)
DTYPES = ("|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8")
_DTYPE_CODE = {np.dtype(name): code for code, name in enumerate(DTYPES)}
BYTES, BITS, RANGE, FILL = range(4)  # how a column's values travel (module doc)


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
        meta = {
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "offset": sum(len(c) for c in chunks),
        }
        chunks.append(array.tobytes())
        return meta

    for path, value in _flatten(body):
        if not _is_mapping(value):
            values[path] = value
            continue
        entities = list(value)
        if entities and _is_mapping(value[entities[0]]):  # dict observations
            keys = list(value[entities[0]])
            if any(not _is_mapping(value[e]) or value[e].keys() != set(keys) for e in entities):
                raise ValueError(f"{path}: dict observations of one map must have the same keys")
            maps[path] = {
                "entities": entities,
                "keys": {
                    key: put([value[e][key] for e in entities], f"{path}.{key}") for key in keys
                },
            }
        else:
            maps[path] = {"entities": entities, **put([value[e] for e in entities], path)}
    header = json.dumps({"maps": maps, "values": values}).encode()
    return _LENGTH.pack(len(header)) + header + b"".join(chunks)


def _encode_columns(body: Mapping[str, Any]) -> bytes:
    entries: list[tuple[str, np.ndarray]] = []
    values: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, np.ndarray):
                entries.append((path, value))
            elif _is_mapping(value) and _holds_arrays(value):
                walk(value, path + ".")
            else:  # (a mapping without arrays, e.g. a config, goes whole)
                values[path] = value

    walk(body, "")
    head = bytearray(COLUMNS_MAGIC)
    head += _varint(len(entries))
    chunks: list[bytes] = []
    for path, array in entries:
        code = _DTYPE_CODE.get(array.dtype)
        if code is None and array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
            code = _DTYPE_CODE.get(array.dtype)
        if code is None:
            raise ValueError(
                f"{path}: an array of dtype {array.dtype}, not one of {', '.join(DTYPES)}"
            )
        if not 1 <= array.ndim <= MAX_DIMS:
            raise ValueError(f"{path}: {array.ndim} axes; a column has 1-{MAX_DIMS}")
        form, extra, raw = _column_form(array)
        name = path.encode()
        head += _varint(len(name))
        head += name
        head += bytes((code, form, array.ndim))  # (ndim <= MAX_DIMS: a one-byte varint)
        for length in array.shape:
            head += _varint(length)
        head += extra
        if raw:
            chunks.append(raw)
    text = dumps(values) if values else b""  # (orjson: compact, fast)
    head += _varint(len(text))
    head += text
    return b"".join((head, *chunks))


def _column_form(array: np.ndarray) -> tuple[int, bytes, bytes]:
    """How `array` travels: (form, what the header adds, the bytes that follow it)."""
    start = range_start(array)
    if start is not None:
        return RANGE, _varint(2 * start if start >= 0 else -2 * start - 1), b""
    raw = array.tobytes()  # (row-major, whatever the array's strides)
    if array.size >= 2:
        # all values the same, bit for bit (-0.0 is not 0.0; NaN is NaN): the bytes repeat
        # with the item's period
        view, size = memoryview(raw), array.itemsize
        if view[size:] == view[:-size]:
            return FILL, raw[:size], b""
    if array.dtype.kind == "b" and array.size > PACK_FROM:  # a bit each
        return BITS, b"", np.packbits(array.reshape(-1)).tobytes()
    return BYTES, b"", raw


_ONE_BYTE = [bytes((value,)) for value in range(0x80)]


def _varint(value: int) -> bytes:
    """`value` >= 0 in LEB128: 7 bits a byte, low first; the high bit says more follow."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _holds_arrays(node: Mapping[str, Any]) -> bool:
    return any(
        isinstance(v, np.ndarray) or (_is_mapping(v) and _holds_arrays(v)) for v in node.values()
    )


def range_start(array: np.ndarray) -> int | None:
    """The first value of an integer vector that counts up by one, else None (the codec's
    RANGE form; the step store's whole-batch check)."""
    if array.ndim != 1 or len(array) < 2 or array.dtype.kind not in "iu":
        return None
    first = array.item(0)
    if array.item(-1) - first != len(array) - 1:
        return None
    # (the bytes of the range it would be: a third of a diff's time on a step's columns)
    counting = np.arange(first, first + len(array), dtype=array.dtype)
    return first if array.tobytes() == counting.tobytes() else None


def decode(data: bytes) -> dict[str, Any]:
    """The body `encode` was given, with each entity's value a numpy array (a view).

    Anything that is not such a message (a header length past the body, a header that is not
    the JSON object above, maps or array specs of the wrong kinds, arrays that do not fit
    the body) raises InvalidRequest saying the encoding is malformed."""
    try:  # (as `_malformed` does, without a context manager's microsecond a message)
        return _decode(data)
    except _MALFORMED as exc:
        raise _malformed_request(exc) from exc


# what a bad message raises while it is read (ValueError covers bad JSON and UTF-8;
# RecursionError a header nested too deep)
_MALFORMED = (ValueError, KeyError, TypeError, struct.error, RecursionError)


@contextlib.contextmanager
def _malformed() -> Iterator[None]:
    """What a bad message raises while it is read, as the InvalidRequest (a 400) naming it."""
    try:
        yield
    except _MALFORMED as exc:
        raise _malformed_request(exc) from exc


def _malformed_request(exc: Exception) -> InvalidRequest:
    return InvalidRequest(f"malformed {CONTENT_TYPE} body: {exc}")


def _decode(data: bytes) -> dict[str, Any]:
    if data[: len(COLUMNS_MAGIC)] == COLUMNS_MAGIC:
        return _decode_columns(data)
    if len(data) < _LENGTH.size:
        raise ValueError(
            f"{len(data)} bytes, too short for the header length ({_LENGTH.size} bytes)"
        )
    (length,) = _LENGTH.unpack_from(data, 0)
    base = _LENGTH.size + length
    if base > len(data):
        raise ValueError(
            f"the header length {length} runs past the body "
            f"({len(data) - _LENGTH.size} bytes after it)"
        )
    header = _loads(bytes(data[_LENGTH.size : base]))
    if type(header) is dict and "arrays" in header:
        raise ValueError(
            "a JSON header of 'arrays' is the column form before 2026-11-27; "
            f"column messages now start with {COLUMNS_MAGIC!r} (mistk_rl.wire.codec)"
        )
    header = _object(header, "the header", required=("maps",), optional=("values",))
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
            arrays = {
                key: _array(data, base, part, len(entities), f"{where}.keys[{key!r}]", also=())
                for key, part in parts.items()
            }
            stacked = StackedMap(
                (entity, {key: a[i] for key, a in arrays.items()})
                for i, entity in enumerate(entities)
            )
            stacked.array = arrays
        else:
            entities = _entities(_object(meta, where, required=("entities",))["entities"], where)
            array = _array(data, base, meta, len(entities), where)
            stacked = StackedMap(zip(entities, array))
            stacked.array = array
        _put(body, path, stacked)
    return body


MAX_COLUMN_DEPTH = 3  # reset.obs.planes
MAX_DIMS = 8  # axes of one column
# bytes that the ranges and fills of one message may stand for (a body's default limit):
# they take no bytes on the wire, so without a bound a few header bytes could ask for
# gigabytes
MAX_EXPANDED_BYTES = 16 * 1024 * 1024


class Column(NamedTuple):
    """One array of a column-form message as its header describes it."""

    path: str
    dtype: np.dtype
    form: int  # BYTES, BITS, RANGE or FILL
    shape: tuple[int, ...]
    first: Any = None  # RANGE: the first value; FILL: the one value's bytes

    @property
    def wire_bytes(self) -> int:
        """Bytes of this array after the header."""
        count = math.prod(self.shape)
        if self.form == BYTES:
            return count * self.dtype.itemsize
        return -(-count // 8) if self.form == BITS else 0


def describe(data: bytes) -> tuple[list[Column], dict[str, Any]]:
    """A column-form message's header: its arrays in order, and its other values (for tests
    and for looking at what crossed the wire)."""
    with _malformed():
        columns, values, _ = _read_columns_header(data)
    return [Column(*column) for column in columns], values


_NUMPY_DTYPES = [np.dtype(name) for name in DTYPES]
_INT_BOUNDS = {
    dtype: (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    for dtype in _NUMPY_DTYPES
    if dtype.kind in "iu"
}


def _read_columns_header(data: bytes) -> tuple[list[tuple], dict[str, Any], int]:
    """(columns as `Column`'s fields, values, where the arrays' bytes start)."""
    if data[: len(COLUMNS_MAGIC)] != COLUMNS_MAGIC:
        raise ValueError(f"not a column-form message (it does not start with {COLUMNS_MAGIC!r})")
    count, at = _varint_at(data, len(COLUMNS_MAGIC), "the number of arrays")
    columns: list[tuple] = []
    expanded = 0
    for index in range(count):
        try:
            column, at = _read_column(data, at)
        except ValueError as exc:
            raise ValueError(f"array {index}: {exc}") from None
        _, dtype, form, shape, _ = column
        if form >= RANGE:  # (RANGE, FILL: no bytes on the wire)
            expanded += math.prod(shape) * dtype.itemsize
            if expanded > MAX_EXPANDED_BYTES:
                raise ValueError(
                    f"ranges and fills stand for more than {MAX_EXPANDED_BYTES:,} bytes"
                )
        columns.append(column)
    length, at = _varint_at(data, at, "the values' length")
    if at + length > len(data):
        raise ValueError("the values run past the body")
    values = _object(_loads(bytes(data[at : at + length])), "the values") if length else {}
    return columns, values, at + length


def _read_column(data: bytes, at: int) -> tuple[tuple, int]:
    """The fields of the `Column` whose header entry starts at `at` (a plain tuple: a named
    one costs more to make than the rest of the entry to read), and where the entry ends."""
    length, at = _varint_at(data, at, "a field path's length")
    if at + length + 2 > len(data):
        raise ValueError("a field path, dtype and form run past the body")
    path = data[at : at + length].decode()
    code, form = data[at + length], data[at + length + 1]
    if code >= len(DTYPES):
        raise ValueError(f"{path!r}: dtype code {code} is not one of 0-{len(DTYPES) - 1}")
    dtype = _NUMPY_DTYPES[code]
    ndim, at = _varint_at(data, at + length + 2, "the number of axes")
    if not 1 <= ndim <= MAX_DIMS:
        raise ValueError(f"{path!r}: {ndim} axes, not 1-{MAX_DIMS}")
    shape = []
    for _ in range(ndim):
        size, at = _varint_at(data, at, "the shape")
        shape.append(size)
    first: Any = None
    if form == RANGE:
        if dtype.kind not in "iu" or ndim != 1:
            raise ValueError(f"{path!r}: a range is an integer vector")
        zigzag, at = _varint_at(data, at, "the range's first value")
        first = zigzag >> 1 if not zigzag & 1 else -(zigzag >> 1) - 1
        low, high = _INT_BOUNDS[dtype]
        if shape[0] and not low <= first <= first + shape[0] - 1 <= high:
            raise ValueError(f"{path!r}: the range does not fit {dtype}")
    elif form == FILL:
        if at + dtype.itemsize > len(data):
            raise ValueError("the fill's value runs past the body")
        first, at = data[at : at + dtype.itemsize], at + dtype.itemsize
    elif form == BITS:
        if dtype.kind != "b":
            raise ValueError(f"{path!r}: bits are for a bool array")
    elif form != BYTES:
        raise ValueError(f"{path!r}: form {form} is not one of 0-3")
    return (path, dtype, form, tuple(shape), first), at


def _varint_at(data: bytes, at: int, what: str) -> tuple[int, int]:
    """The varint at `at` and where it ends (a function, not a reader object's method: a
    step's header has some 30 of them, most of one byte)."""
    if at < len(data) and data[at] < 0x80:
        return data[at], at + 1
    value = 0
    for shift in range(0, 70, 7):
        if at >= len(data):
            raise ValueError(f"{what} runs past the body")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    raise ValueError(f"{what} is longer than 10 bytes")


def _decode_columns(data: bytes) -> dict[str, Any]:
    columns, values, at = _read_columns_header(data)
    body: dict[str, Any] = {}
    for path, value in values.items():
        _put_column(body, path, value)
    for path, dtype, form, shape, first in columns:
        if form == BYTES or form == BITS:
            count = math.prod(shape)
            size = count * dtype.itemsize if form == BYTES else -(-count // 8)
            if at + size > len(data):
                raise ValueError(f"{path!r}: shape {shape} of {dtype} runs past the body")
            if form == BYTES:
                array = np.frombuffer(data, dtype, count, at).reshape(shape)
            else:
                bits = np.frombuffer(data, np.uint8, size, at)
                array = np.unpackbits(bits, count=count).view(bool).reshape(shape)
            at += size
        elif form == RANGE:
            array = np.arange(first, first + shape[0], dtype=dtype)
        else:  # FILL: the value's bytes, repeated (bit for bit, as sent)
            array = np.frombuffer(first * math.prod(shape), dtype).reshape(shape)
        _put_column(body, path, array)
    if at != len(data):
        raise ValueError(f"{len(data) - at} bytes after the last array")
    return body


def _put_column(body: dict, path: str, value: Any) -> None:
    """`body[a][b][c] = value` for path ``a.b.c`` (at most `MAX_COLUMN_DEPTH` parts)."""
    parts = _column_parts(path)
    if len(parts) == 1 and path not in body:  # (most columns: a field of the body)
        body[path] = value
    else:
        _set(body, path, list(parts), value)


@functools.lru_cache(maxsize=256)
def _column_parts(path: str) -> tuple[str, ...]:
    """A column's field path split at its dots (the few paths of a step, split once)."""
    parts = tuple(path.split("."))
    if not all(parts) or len(parts) > MAX_COLUMN_DEPTH:
        raise ValueError(f"{path!r} is not a field path of at most {MAX_COLUMN_DEPTH} parts")
    return parts


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


def _object(
    value: Any, what: str, required: tuple[str, ...] = (), optional: tuple[str, ...] | None = None
) -> dict:
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


def _array(
    data: bytes, base: int, meta: dict, rows: int, where: str, also: tuple[str, ...] = ("entities",)
) -> np.ndarray:
    """The stacked array `meta` describes (a view into `data`), of `rows` rows (`also`: the
    keys `meta` may hold besides the array's)."""
    meta = _object(meta, where, required=_ARRAY_FIELDS, optional=also)
    if type(meta["dtype"]) is not str:
        raise ValueError(f"{where}.dtype {meta['dtype']!r} is not a dtype string")
    dtype = np.dtype(meta["dtype"])
    if dtype.kind not in "biuf":
        raise ValueError(f"{where}.dtype {dtype} is not numeric")
    if type(meta["shape"]) is not list or not meta["shape"]:
        raise ValueError(
            f"{where}.shape {meta['shape']!r} is not a list of one length per axis, rows first"
        )
    shape = tuple(_count(n, f"{where}.shape entry") for n in meta["shape"])
    start = base + _count(meta["offset"], f"{where}.offset")
    count = math.prod(shape)
    if shape[0] != rows:
        raise ValueError(f"{where}: {shape[0]} rows for {rows} entities")
    size = count * dtype.itemsize
    if start + size > len(data):
        raise ValueError(
            f"{where}: shape {shape} of {dtype} at offset {meta['offset']} runs past the body"
        )
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
        raise ValueError(
            f"{path!r} is not a field path (a field, or one inside {', '.join(sorted(CONTAINERS))})"
        )
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
    return {
        "names": list(arrays),
        "shapes": [list(a.shape) for a in arrays.values()],
        "values": np.concatenate([np.asarray(a, np.float32).reshape(-1) for a in arrays.values()])
        if arrays
        else np.zeros(0, np.float32),
    }


def unpack_arrays(wire: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """`pack_arrays`' inverse; a ValueError when the shapes do not add up to the values."""
    values = np.asarray(wire["values"], np.float32).reshape(-1)
    sizes = [int(np.prod(shape)) for shape in wire["shapes"]]
    if len(wire["names"]) != len(sizes) or sum(sizes) != len(values):
        raise ValueError("weights: names, shapes and values do not agree")
    parts = np.split(values, np.cumsum(sizes)[:-1]) if sizes else []
    return {
        name: part.reshape(shape) for name, part, shape in zip(wire["names"], parts, wire["shapes"])
    }
