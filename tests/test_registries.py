"""Extension points are declared once (`mistk_rl.registry`): the specs' enums, the request
models and the messages all read the registries."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from mistk_rl.games.opponents import OPPONENTS, UniformOpponent
from mistk_rl.registry import Registry, did_you_mean
from mistk_rl.schemas import ExhaustiveSpec
from mistk_rl.service.app import fill_registry_enums, load_spec


def _marked(node, found):
    if isinstance(node, dict):
        if "x-mistk-registry" in node:
            found.append(node)
        for value in node.values():
            _marked(value, found)
    elif isinstance(node, list):
        for value in node:
            _marked(value, found)
    return found


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_spec_enums_are_the_registries(role):
    for schema in _marked(load_spec(role), []):
        assert schema["enum"] == Registry.named(schema["x-mistk-registry"]).names()


def test_the_orchestrator_spec_names_its_registries():
    names = {s["x-mistk-registry"] for s in _marked(load_spec("orchestrator"), [])}
    assert "opponents" in names


def test_registry_refuses_twins_and_suggests_names():
    registry: Registry[int] = Registry("test-numbers", "number")
    registry.add("one", 1)
    with pytest.raises(ValueError, match="registered already"):
        registry.add("one", 2)
    with pytest.raises(KeyError, match="Did you mean 'one'"):
        registry["onee"]
    with pytest.raises(ValueError, match="known: one"):
        registry.validate("two")
    with pytest.raises(ValueError, match="exists already"):
        Registry("test-numbers", "number")
    assert did_you_mean("x", [], "thing") == "unknown thing 'x'; known: none"
    with pytest.raises(KeyError):
        fill_registry_enums({"x-mistk-registry": "no-such-registry"})


def test_a_new_opponent_is_declared_by_its_class_alone():
    """Writing the class registers it: the spec, exhaustive evaluations and the opponent
    agents then know it."""
    class Corner(UniformOpponent):
        name, label = "test_corner", "corner"

        def replies(self, obs, mask):
            return [0]

    try:
        assert OPPONENTS["test_corner"] is Corner
        assert ExhaustiveSpec(agent="a", opponent="test_corner").opponent == "test_corner"
        assert fill_registry_enums({"x-mistk-registry": "opponents"})["enum"][-1] == "test_corner"
    finally:
        OPPONENTS._entries.pop("test_corner")


def test_request_models_check_opponents_against_the_registry():
    with pytest.raises(ValidationError, match="Did you mean 'tictactoe_perfect'"):
        ExhaustiveSpec(agent="a", opponent="tictactoe_perfec")
