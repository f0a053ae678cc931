"""Request validation compiled from the spec, for every operation (`pipeline.py`).

jsonschema checks the spec's ``Tensor`` (a number or nested lists of numbers, as a `oneOf` per
level) at about 20 ms for 256 four-number observations, so each request schema is compiled
once into plain Python checks instead. Schemas marked ``x-tensor: true`` get a direct
recursive check that means exactly the same as their `oneOf`; the few other keywords our specs
use are supported one by one, and any other keyword is refused at compile time, so the spec
cannot silently use something this validator ignores. Error messages follow jsonschema's
wording (``<problem> - '<path>'``); a value that fits no option of a `oneOf` gets the deepest
option error, as jsonschema's `best_match` picks it. Bodies decoded from the binary
encoding (`mistk_rl.wire.codec`) hold numpy values where JSON has numbers and lists; they pass the
same checks (a Tensor is then a numeric array of rank <= 4).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable, NoReturn, Optional

import numpy as np

from mistk_rl.errors import InvalidRequest
from mistk_rl.wire.codec import StackedMap

Check = Callable[[Any, str], None]
# (x-mistk-registry: the enum load_spec filled in from the registry is what is checked)
IGNORED = {"description", "default", "example", "title", "nullable", "format", "x-mistk-registry"}
# an extension OpenAPI 3.0 lacks a keyword for: the pattern every key of an object matches,
# whole (JSON Schema's propertyNames: {pattern}); the spec's DictSpace keys use it
KEY_PATTERN = "x-key-pattern"
# the keywords `compile_schema` checks (any other, outside IGNORED, is refused)
CHECKED_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "oneOf",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minProperties",
        "maxProperties",
        "minItems",
        "maxItems",
        "x-tensor",
        "x-column",
        KEY_PATTERN,
    }
)
MAX_TENSOR_RANK = 4
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, (bool, np.bool_)),
    "integer": lambda v: type(v) is int or _numpy_kind(v, "iu", 0),
    "number": lambda v: (
        type(v) is int or (type(v) is float and math.isfinite(v)) or _numpy_kind(v, "iuf", 0)
    ),
}


def _numpy_kind(value: Any, kinds: str, max_rank: int) -> bool:
    """A numpy value (from a binary body) of one of `kinds`, rank <= `max_rank`."""
    return (
        isinstance(value, (np.ndarray, np.generic))
        and value.dtype.kind in kinds
        and np.ndim(value) <= max_rank
    )


def compile_schema(schema: dict) -> Check:
    """A function `check(value, path)` raising InvalidRequest; refs must be resolved."""
    if schema.get("x-tensor"):
        return _tensor
    if schema.get("x-column"):
        return _column
    _refuse_unknown(schema)
    checks = _checks(schema)

    def check(value: Any, path: str) -> None:
        for step in checks:
            step(value, path)

    return check


def _refuse_unknown(schema: dict) -> None:
    """ValueError naming the keywords of `schema` that `_checks` would not check."""
    unknown = set(schema) - IGNORED - CHECKED_KEYWORDS
    if unknown:
        raise ValueError(
            f"schema keywords not supported by the step-path validator: {sorted(unknown)}"
        )


def _checks(schema: dict) -> list[Check]:
    """One check per supported keyword of `schema` (and its subschemas'), in the order
    they run."""
    checks: list[Check] = []
    if "type" in schema:
        checks.append(_type(schema["type"], schema.get("nullable", False)))
    if "enum" in schema:
        checks.append(_enum(schema["enum"]))
    if schema.get("type") in ("number", "integer"):
        checks.extend(_bounds(schema))
    if schema.get("type") == "string":
        checks.extend(_string(schema))
    if "oneOf" in schema:
        checks.append(
            _one_of(
                [(_guard(s), compile_schema(s)) for s in schema["oneOf"]],
                _discriminator(schema["oneOf"]),
            )
        )
    if "minItems" in schema or "maxItems" in schema:
        checks.append(_length(schema.get("minItems", 0), schema.get("maxItems")))
    if "items" in schema:
        checks.append(_items(compile_schema(schema["items"])))
    if schema.get("type") == "object" or "properties" in schema:
        checks.append(_object(schema))
    return checks


class SchemaError(InvalidRequest):
    """A value the schema refuses (400), with where in the body: `depth` path components."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(f"{message} - '{path}'" if path else message)
        self.depth = path.count(".") + 1 if path else 0


def _fail(message: str, path: str) -> NoReturn:
    raise SchemaError(message, path)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _type(name: str, nullable: bool) -> Check:
    test = _TYPES[name]

    def check(value: Any, path: str) -> None:
        if not test(value) and not (nullable and value is None):
            _fail(f"{value!r} is not of type '{name}'", path)

    return check


def _enum(options: list) -> Check:
    def check(value: Any, path: str) -> None:
        if value not in options:
            _fail(f"{value!r} is not one of {options!r}", path)

    return check


def _bounds(schema: dict) -> list[Check]:
    """Bound checks (None passes them: `_type` decides whether it may be)."""
    checks: list[Check] = []
    if "minimum" in schema:
        low = schema["minimum"]

        def at_least(v: Any, p: str) -> None:
            if v is not None and v < low:
                _fail(f"{v!r} is less than the minimum of {low!r}", p)

        checks.append(at_least)
    if "maximum" in schema:
        high = schema["maximum"]

        def at_most(v: Any, p: str) -> None:
            if v is not None and v > high:
                _fail(f"{v!r} is greater than the maximum of {high!r}", p)

        checks.append(at_most)
    return checks


def _string(schema: dict) -> list[Check]:
    """Length and pattern checks (None passes them: `_type` decides whether it may be)."""
    checks: list[Check] = []
    if "minLength" in schema:
        shortest = schema["minLength"]

        def long_enough(v: Any, p: str) -> None:
            if v is not None and len(v) < shortest:
                _fail(f"{v!r} is too short", p)

        checks.append(long_enough)
    if "maxLength" in schema:
        longest = schema["maxLength"]

        def short_enough(v: Any, p: str) -> None:
            if v is not None and len(v) > longest:
                _fail(f"{v!r} is too long", p)

        checks.append(short_enough)
    if "pattern" in schema:
        regex = re.compile(schema["pattern"])

        def matches(v: Any, p: str) -> None:
            if v is not None and not regex.search(v):
                _fail(f"{v!r} does not match {schema['pattern']!r}", p)

        checks.append(matches)
    return checks


def _column(value: Any, path: str) -> None:
    """``x-column: true``: rows of numbers, one per env copy: an array (JSON) or a numpy
    array of rank >= 1 (binary), or, for a Dict observation space, an object with one such
    per key. Only the shape of the body is checked here: the service checks each column
    against the registered spaces with numpy, in one pass (`handlers.AgentService`)."""
    if isinstance(value, dict) and value:
        for key, column in value.items():
            if not _is_column(column):
                _fail(f"{_short(column)} is not an array of rows", _join(path, key))
        return
    if not _is_column(value):
        _fail(
            f"{_short(value)} is not an array of rows (or an object of them, one per "
            "key of a Dict space)",
            path,
        )


def _is_column(value: Any) -> bool:
    return isinstance(value, list) or (
        isinstance(value, np.ndarray) and value.ndim >= 1 and value.dtype.kind in "biuf"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _guard(schema: dict) -> Callable[[Any], bool]:
    """A quick test that is False only where `schema` surely fails (its type does not fit),
    so `oneOf` skips such an option without raising (an observation's oneOf of Tensor and
    object is tried once per entity per step)."""
    if schema.get("x-tensor"):
        return lambda v: not isinstance(v, (dict, str)) and v is not None
    if "type" in schema and not schema.get("nullable"):
        return _TYPES[schema["type"]]
    return lambda v: True


def _discriminator(options: list[dict]) -> Optional[tuple[str, list[list]]]:
    """(property, the values each option allows there) when every option is an object with
    an enum on one property they share: what tells them apart (Space's ``type``; OpenAPI's
    `discriminator`, inferred), so an error can be the one of the option a value names."""
    shared = set.intersection(*(set(o.get("properties", {})) for o in options))
    for name in sorted(shared):
        enums = [o["properties"][name].get("enum") for o in options]
        if all(enums):
            return name, enums
    return None


def _one_of(
    options: list[tuple[Callable[[Any], bool], Check]],
    discriminator: Optional[tuple[str, list[list]]],
) -> Check:
    checks = [option for _, option in options]

    def check(value: Any, path: str) -> None:
        matched = 0
        for guard, option in options:
            if not guard(value):
                continue
            try:
                option(value, path)
                matched += 1
            except SchemaError:
                pass
        if matched > 1:
            _fail(f"{value!r} is valid under each of several given schemas", path)
        if not matched:
            _fail_best(value, path, checks, discriminator)

    return check


def _fail_best(
    value: Any, path: str, options: list[Check], discriminator: Optional[tuple[str, list[list]]]
) -> None:
    """Raise the most telling error for a value no option took: that of the option the
    value names (`_discriminator`), else of the option that got deepest into it, else the
    plain oneOf error when two got equally deep (jsonschema's `best_match`: shallower errors
    are likely about another kind of value)."""
    if discriminator is not None and isinstance(value, dict) and discriminator[0] in value:
        name, enums = discriminator
        named = [option for option, allowed in zip(options, enums) if value[name] in allowed]
        if not named:
            _fail(
                f"{value[name]!r} is not one of {[v for e in enums for v in e]!r}",
                _join(path, name),
            )
        options = named
    errors = []
    for option in options:
        try:
            option(value, path)
        except SchemaError as exc:
            errors.append(exc)
    errors.sort(key=lambda e: -e.depth)
    if not errors or (len(errors) > 1 and errors[0].depth == errors[1].depth):
        _fail(f"{value!r} is not valid under any of the given schemas", path)
    raise errors[0]


def _length(fewest: int, most: Optional[int]) -> Check:
    def check(value: Any, path: str) -> None:
        if isinstance(value, list):
            if len(value) < fewest:
                _fail(f"{len(value)} items: at least {fewest} expected", path)
            if most is not None and len(value) > most:
                _fail(f"{len(value)} items: at most {most} allowed", path)

    return check


def _items(item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if isinstance(value, list):
            for i, element in enumerate(value):
                item(element, _join(path, i))

    return check


def _object(schema: dict) -> Check:
    properties = {k: compile_schema(v) for k, v in schema.get("properties", {}).items()}
    required = list(schema.get("required", []))
    extra = schema.get("additionalProperties", True)
    extra_check = compile_schema(extra) if isinstance(extra, dict) else None

    fewest = schema.get("minProperties", 0)
    most = schema.get("maxProperties")
    key_pattern = re.compile(schema[KEY_PATTERN]) if KEY_PATTERN in schema else None

    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            return
        if len(value) < fewest:
            _fail(f"{value!r} does not have enough properties", path)
        if most is not None and len(value) > most:
            _fail(f"{value!r} has too many properties", path)
        for key in required:
            if key not in value:
                _fail(f"'{key}' is a required property", path)
        if key_pattern is not None:
            for key in value:
                if not key_pattern.fullmatch(key):
                    _fail(f"key {key!r} does not match {key_pattern.pattern!r}", path)
        entries: Iterable[tuple[Any, Any]] = value.items()
        if type(value) is StackedMap and not properties:  # one dtype and shape: check one
            entries = list(entries)[:1]
        for key, element in entries:
            if key in properties:
                properties[key](element, _join(path, key))
            elif extra_check is not None:
                extra_check(element, _join(path, key))
            elif extra is False:
                _fail(f"Additional properties are not allowed ({key!r} was unexpected)", path)

    return check


def _tensor(value: Any, path: str, rank: int = MAX_TENSOR_RANK) -> None:
    """Exactly the spec's Tensor: a number, or a list whose items are Tensors of one rank
    less (innermost items numbers); booleans are not numbers."""
    if type(value) in (int, float) or _numpy_kind(value, "iuf", rank):
        return
    if rank > 0 and type(value) is list:
        for element in value:
            if type(element) not in (int, float):
                _tensor(element, path, rank - 1)
        return
    _fail(f"{value!r} is not valid under any of the given schemas", path)
