"""The compiled validator accepts exactly what connexion's request validator (jsonschema's
Draft 4 plus OpenAPI's `nullable`) accepts on the spec, with the spec's one extension
(`x-key-pattern`: what JSON Schema's propertyNames pattern says) added to it, for every
request body of both specs."""

from __future__ import annotations

import re

import numpy as np
import pytest
from connexion.json_schema import Draft4RequestValidator, resolve_refs
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import ValidationError, validators

from mistk_rl.errors import InvalidRequest
from mistk_rl.service.app import load_spec
from mistk_rl.service.pipeline import STEP_OPERATIONS
from mistk_rl.service.validation import KEY_PATTERN, compile_schema
from mistk_rl.spaces import DICT_KEY

SPECS = {role: resolve_refs(load_spec(role)) for role in ("agent", "orchestrator")}
SCHEMAS = {
    op["post"]["operationId"] if role == "agent" else f"{role}.{op['post']['operationId']}": op[
        "post"
    ]["requestBody"]["content"]["application/json"]["schema"]
    for role, spec in SPECS.items()
    for op in spec["paths"].values()
    if "post" in op and "requestBody" in op["post"]
}
KEYS = st.sampled_from(
    [
        "obs",
        "actionMask",
        "prevObs",
        "actions",
        "rewards",
        "newObs",
        "terminated",
        "truncated",
        "replay",
        "p",
        "q",
        "extra",
        "env",
        "id",
        "numEpisodes",
        "numEnvs",
        "envManager",
        "name",
        "hyperparameters",
    ]
)
numbers = st.one_of(st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=25,
)
tensors = st.recursive(numbers, lambda inner: st.lists(inner, max_size=3), max_leaves=12)
tensor_maps = st.dictionaries(st.sampled_from(["p", "q"]), tensors, max_size=2)
# dict observations: {key: Tensor}, and what is almost one (a nested dict, a text value)
observations = st.one_of(
    tensors,
    st.dictionaries(
        st.sampled_from(["a", "b"]),
        st.one_of(tensors, st.text(max_size=2), tensor_maps),
        max_size=2,
    ),
)
observation_maps = st.dictionaries(st.sampled_from(["p", "q"]), observations, max_size=2)
plausible = st.fixed_dictionaries(
    {"obs": observation_maps}, optional={"actionMask": tensor_maps, "extra": json_values}
)
replays = st.fixed_dictionaries(
    {
        "prevObs": observation_maps,
        "actions": tensor_maps,
        "newObs": observation_maps,
        "rewards": st.dictionaries(st.sampled_from(["p", "q"]), numbers, max_size=2),
        "terminated": st.dictionaries(st.sampled_from(["p", "q"]), st.booleans(), max_size=2),
    }
)
plausible_steps = st.fixed_dictionaries({"obs": observation_maps}, optional={"replay": replays})
# spaces: fundamental ones, Dicts of them, Dicts in Dicts, and near misses
fundamental_spaces = st.fixed_dictionaries(
    {"type": st.sampled_from(["Box", "Discrete", "MultiBinary", "Dict", "Tuple"])},
    optional={
        "shape": st.lists(st.integers(-1, 3), max_size=2),
        "n": st.integers(0, 2),
        "dtype": st.sampled_from(["float32", "uint8"]),
        "low": tensors,
        "spaces": st.just({}),
    },
)
spaces = st.recursive(
    fundamental_spaces,
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["Dict", "Box"])},
        optional={
            "spaces": st.dictionaries(
                st.sampled_from(["a", "b", "c d", "", "e\n"]), inner, max_size=3
            )
        },
    ),
    max_leaves=6,
)
registrations = st.fixed_dictionaries(
    {"name": st.just("p")}, optional={"observationSpace": spaces, "actionSpace": spaces}
)


def _key_pattern(validator, pattern, instance, schema):
    """`x-key-pattern` as jsonschema would check propertyNames: {pattern} (whole keys)."""
    if validator.is_type(instance, "object"):
        for key in instance:
            if not re.fullmatch(pattern, key):
                yield ValidationError(f"key {key!r} does not match {pattern!r}")


SpecValidator = validators.extend(Draft4RequestValidator, {KEY_PATTERN: _key_pattern})


def _agree(name: str, value) -> None:
    expected = SpecValidator(SCHEMAS[name]).is_valid(value)
    try:
        compile_schema(SCHEMAS[name])(value, "")
        got = True
    except InvalidRequest:
        got = False
    assert got == expected, (name, value)


def test_the_step_operations_are_in_the_spec():
    assert set(STEP_OPERATIONS) - {"getPolicy"} <= set(SCHEMAS)  # (a GET: no body)
    assert "/policy" in SPECS["agent"]["paths"]


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(SCHEMAS)), value=st.one_of(json_values, plausible))
def test_compiled_validator_agrees_with_connexion(name, value):
    _agree(name, value)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_compiled_validator_agrees_on_dict_observations_and_spaces(data):
    name = data.draw(
        st.sampled_from(["getAction", "step", "replayAction", "episodeStarted", "agentRegistered"])
    )
    body = {"agentRegistered": registrations, "replayAction": replays, "step": plausible_steps}.get(
        name, plausible
    )
    _agree(name, data.draw(body))


@pytest.mark.parametrize(
    "value, fragment",
    [
        ({"obs": {"p": [1, [2, 3]]}}, None),  # ragged is a valid Tensor
        ({"obs": {"p": {"a": [1.0], "b": [[0, 1]]}}}, None),  # a dict observation
        ({"obs": {"p": {}}}, "obs.p"),  # a dict observation has at least one key
        ({"obs": {"p": {"a": {"b": 1}}}}, "obs.p"),  # no dict in a dict
        ({"obs": {"p": {"a": [True]}}}, "obs.p"),
        ({"obs": {"p": [[[[[1]]]]]}}, "obs.p"),  # rank 5
        ({"obs": {"p": [True]}}, "obs.p"),  # booleans are not numbers
        ({}, "'obs' is a required property"),
        ({"obs": {"p": 1}, "more": 1}, "'more' was unexpected"),
        ({"obs": {}}, "does not have enough properties"),
    ],
)
def test_examples(value, fragment):
    check = compile_schema(SCHEMAS["getAction"])
    if fragment is None:
        check(value, "")
        return
    with pytest.raises(InvalidRequest, match=fragment.replace(".", r"\.")):
        check(value, "")


@pytest.mark.parametrize(
    "workers, ok", [([], False), (["http://a"], True), (["http://a"] * 65, False)]
)
def test_array_lengths_agree_with_connexion(workers, ok):
    body = {
        "env": {
            "id": "g",
            "league": {"players": [{"id": "main", "type": "main"}], "workers": workers},
        }
    }
    _agree("orchestrator.initialize", body)
    assert Draft4RequestValidator(SCHEMAS["orchestrator.initialize"]).is_valid(body) == ok


@pytest.mark.parametrize(
    "space, fragment",
    [
        (
            {"type": "Box", "shape": [-1]},
            "-1 is less than the minimum of 0 - 'observationSpace.shape.0'",
        ),
        ({"type": "Foo"}, "'Foo' is not one of .*'Dict'] - 'observationSpace.type'"),
        (
            {
                "type": "Dict",
                "spaces": {"a": {"type": "Dict", "spaces": {"b": {"type": "Discrete"}}}},
            },
            "'Dict' is not one of .* - 'observationSpace.spaces.a.type'",
        ),
        (
            {"type": "Dict", "spaces": {f"k{i}": {"type": "Discrete", "n": 2} for i in range(65)}},
            "has too many properties - 'observationSpace.spaces'",
        ),
        ({"type": "Dict"}, "'spaces' is a required property - 'observationSpace'"),
        ({"shape": [1]}, "not valid under any of the given schemas - 'observationSpace'"),
    ],
)
def test_a_space_that_fits_no_option_gets_the_most_telling_error(space, fragment):
    """oneOf's error is that of the option the value's type names, else of the option that
    got deepest into the value (jsonschema's best_match); two options failing equally deep
    give the plain oneOf error."""
    body = {"name": "p", "observationSpace": space}
    _agree("agentRegistered", body)
    with pytest.raises(InvalidRequest, match=fragment):
        compile_schema(SCHEMAS["agentRegistered"])(body, "")


def test_one_of_skips_options_whose_type_cannot_fit(monkeypatch):
    """An observation's oneOf (Tensor or object) runs only the option that can fit, raising
    nothing on the way: the per-step JSON path checks every entity through it."""
    from mistk_rl.service import validation

    failures = []

    def counting_fail(message, path):
        failures.append(path)
        raise validation.SchemaError(message, path)

    monkeypatch.setattr(validation, "_fail", counting_fail)
    check = compile_schema(SCHEMAS["getAction"])
    check({"obs": {"p": [0.5, 1.0], "q": {"a": [1, 2], "b": 3}}}, "")
    assert failures == []
    with pytest.raises(InvalidRequest, match="obs.p"):
        check({"obs": {"p": "text"}}, "")


def test_unsupported_keywords_are_refused_at_compile_time():
    with pytest.raises(ValueError, match="allOf"):
        compile_schema({"allOf": [{"type": "number"}]})


def test_binary_maps_are_checked_through_one_entry():
    from mistk_rl.wire import codec

    check = compile_schema(SCHEMAS["getAction"])
    check(codec.decode(codec.encode({"obs": {f"e{i}": [0.0, 1.0] for i in range(8)}})), "")
    as_bools = codec.decode(codec.encode({"obs": {f"e{i}": [True, False] for i in range(8)}}))
    with pytest.raises(InvalidRequest, match="obs.e0"):  # booleans are not numbers
        check(as_bools, "")
    rank5 = codec.decode(codec.encode({"obs": {"e0": np.zeros((1, 1, 1, 1, 1))}}))
    with pytest.raises(InvalidRequest):
        check(rank5, "")


@pytest.mark.parametrize(
    "value, ok",
    [({"numEpisodes": None}, True), ({"numEpisodes": 0}, False), ({"numEpisodes": "1"}, False)],
)
def test_nullable_fields_accept_null(value, ok):
    _agree("orchestrator.startEpisode", value)
    assert Draft4RequestValidator(SCHEMAS["orchestrator.startEpisode"]).is_valid(value) == ok


@pytest.mark.parametrize(
    "value, ok",
    [
        ({"url": "http://w"}, True),
        ({"url": "http://w", "replaces": None}, True),
        ({"url": "", "replaces": "http://v"}, False),
        ({"url": "http://w", "replaces": "x" * 2049}, False),
    ],
)
def test_a_nullable_string_with_length_limits_accepts_null(value, ok):
    """(A null once reached the length check: a TypeError, a 500, found by schemathesis.)"""
    check = compile_schema(SCHEMAS["orchestrator.addLeagueWorker"])
    if ok:
        check(value, "")
    else:
        with pytest.raises(InvalidRequest, match="too (short|long)"):
            check(value, "")


def _dict_space_schemas(node):
    """Every DictSpace.spaces schema in a spec."""
    if isinstance(node, dict):
        if KEY_PATTERN in node:
            yield node
        for child in node.values():
            yield from _dict_space_schemas(child)
    elif isinstance(node, list):
        for child in node:
            yield from _dict_space_schemas(child)


def test_the_specs_dict_key_pattern_is_the_services():
    """One rule for Dict keys: the pattern the specs publish (and their validator checks) is
    the one the services build spaces by."""
    for role in ("agent", "orchestrator"):
        found = [s[KEY_PATTERN] for s in _dict_space_schemas(load_spec(role))]
        assert found == [DICT_KEY.pattern], role
        assert (
            DICT_KEY.pattern
            in load_spec(role)["components"]["schemas"]["DictSpace"]["properties"]["spaces"][
                "description"
            ]
        )


@pytest.mark.parametrize("key", ["", "a b", "9a", "a\n", "k" * 65, "é"])
def test_a_dict_key_off_the_pattern_is_refused_by_the_spec_and_the_spaces(key):
    from mistk_rl.spaces import space_from_dict

    space = {"type": "Dict", "spaces": {key: {"type": "Discrete", "n": 2}}}
    body = {"name": "p", "observationSpace": space}
    with pytest.raises(InvalidRequest, match=r"does not match .* - 'observationSpace\.spaces'"):
        compile_schema(SCHEMAS["agentRegistered"])(body, "")
    _agree("agentRegistered", body)
    with pytest.raises(ValueError, match="does not match"):
        space_from_dict(space)
    ok = {"type": "Dict", "spaces": {"_a-1": {"type": "Discrete", "n": 2}}}
    compile_schema(SCHEMAS["agentRegistered"])({"name": "p", "observationSpace": ok}, "")
    space_from_dict(ok)
