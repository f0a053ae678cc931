"""The compiled validator accepts exactly what connexion's request validator (jsonschema's
Draft 4 plus OpenAPI's `nullable`) accepts on the spec, for every request body of both specs."""
from __future__ import annotations

import numpy as np
import pytest
from connexion.json_schema import Draft4RequestValidator, resolve_refs
from hypothesis import given, settings
from hypothesis import strategies as st

from mistk_rl.errors import InvalidRequest
from mistk_rl.service.app import load_spec
from mistk_rl.service.pipeline import STEP_OPERATIONS
from mistk_rl.service.validation import compile_schema

SPECS = {role: resolve_refs(load_spec(role)) for role in ("agent", "orchestrator")}
SCHEMAS = {op["post"]["operationId"] if role == "agent" else f"{role}.{op['post']['operationId']}":
           op["post"]["requestBody"]["content"]["application/json"]["schema"]
           for role, spec in SPECS.items() for op in spec["paths"].values()
           if "post" in op and "requestBody" in op["post"]}
KEYS = st.sampled_from(["obs", "actionMask", "prevObs", "actions", "rewards", "newObs",
                        "terminated", "truncated", "replay", "p", "q", "extra", "env", "id",
                        "numEpisodes", "numEnvs", "envManager", "name", "hyperparameters"])
numbers = st.one_of(st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(KEYS, inner, max_size=4)), max_leaves=25)
tensors = st.recursive(numbers, lambda inner: st.lists(inner, max_size=3), max_leaves=12)
tensor_maps = st.dictionaries(st.sampled_from(["p", "q"]), tensors, max_size=2)
plausible = st.fixed_dictionaries({"obs": tensor_maps},
                                  optional={"actionMask": tensor_maps, "extra": json_values})


def _agree(name: str, value) -> None:
    expected = Draft4RequestValidator(SCHEMAS[name]).is_valid(value)
    try:
        compile_schema(SCHEMAS[name])(value, "")
        got = True
    except InvalidRequest:
        got = False
    assert got == expected, (name, value)


def test_the_step_operations_are_in_the_spec():
    assert set(STEP_OPERATIONS) <= set(SCHEMAS)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(SCHEMAS)), value=st.one_of(json_values, plausible))
def test_compiled_validator_agrees_with_connexion(name, value):
    _agree(name, value)


@pytest.mark.parametrize("value, fragment", [
    ({"obs": {"p": [1, [2, 3]]}}, None),  # ragged is a valid Tensor
    ({"obs": {"p": [[[[[1]]]]]}}, "obs.p"),  # rank 5
    ({"obs": {"p": [True]}}, "obs.p"),  # booleans are not numbers
    ({}, "'obs' is a required property"),
    ({"obs": {"p": 1}, "more": 1}, "'more' was unexpected"),
    ({"obs": {}}, "does not have enough properties"),
])
def test_examples(value, fragment):
    check = compile_schema(SCHEMAS["getAction"])
    if fragment is None:
        check(value, "")
        return
    with pytest.raises(InvalidRequest, match=fragment.replace(".", r"\.")):
        check(value, "")


@pytest.mark.parametrize("workers, ok", [([], False), (["http://a"], True),
                                         (["http://a"] * 65, False)])
def test_array_lengths_agree_with_connexion(workers, ok):
    body = {"env": {"id": "g", "league": {"players": [{"id": "main", "type": "main"}],
                                          "workers": workers}}}
    _agree("orchestrator.initialize", body)
    assert Draft4RequestValidator(SCHEMAS["orchestrator.initialize"]).is_valid(body) == ok


def test_unsupported_keywords_are_refused_at_compile_time():
    with pytest.raises(ValueError, match="allOf"):
        compile_schema({"allOf": [{"type": "number"}]})


def test_binary_maps_are_checked_through_one_entry():
    from mistk_rl import codec

    check = compile_schema(SCHEMAS["getAction"])
    check(codec.decode(codec.encode({"obs": {f"e{i}": [0.0, 1.0] for i in range(8)}})), "")
    as_bools = codec.decode(codec.encode({"obs": {f"e{i}": [True, False] for i in range(8)}}))
    with pytest.raises(InvalidRequest, match="obs.e0"):  # booleans are not numbers
        check(as_bools, "")
    rank5 = codec.decode(codec.encode({"obs": {"e0": np.zeros((1, 1, 1, 1, 1))}}))
    with pytest.raises(InvalidRequest):
        check(rank5, "")


@pytest.mark.parametrize("value, ok", [({"numEpisodes": None}, True), ({"numEpisodes": 0}, False),
                                       ({"numEpisodes": "1"}, False)])
def test_nullable_fields_accept_null(value, ok):
    _agree("orchestrator.startEpisode", value)
    assert Draft4RequestValidator(SCHEMAS["orchestrator.startEpisode"]).is_valid(value) == ok
