"""Extension points are declared once (`mistk_rl.registry`): the specs' enums, the request
models and the messages all read the registries."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mistk_rl.games.opponents import OPPONENTS, UniformOpponent
from mistk_rl.registry import Registry, did_you_mean
from mistk_rl.sdk.schemas import ExhaustiveSpec
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
    assert names == {"opponents", "league_players"}


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


ORCHESTRATORS = [
    "orchestrators.gym_orchestrator:GymOrchestrator",
    "orchestrators.game_orchestrator:GameOrchestrator",
    "orchestrators.league_orchestrator:LeagueOrchestrator",
]


def _classes():
    import importlib

    return [
        getattr(importlib.import_module(m), c)
        for m, c in (target.split(":") for target in ORCHESTRATORS)
    ]


def _aliases(model) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def test_the_spec_lists_every_orchestrators_settings_and_nothing_else():
    """Each orchestrator declares its settings once (its env_settings and episode_settings
    models); the spec's startEpisode body and initialize's env are their union."""
    spec = load_spec("orchestrator")["components"]["schemas"]
    episode = set(spec["EpisodeConfig"]["properties"])
    env = set(spec["OrchestratorInitParams"]["properties"]["env"]["properties"])
    classes = _classes()
    assert set().union(*(_aliases(c.episode_settings) for c in classes)) == episode
    assert set().union(*(_aliases(c.env_settings) for c in classes)) == env


def test_an_option_of_another_orchestrator_is_refused_by_name():
    from mistk_rl.errors import InvalidRequest
    from mistk_rl.service.handlers import refuse_unknown_options

    gym, game, league = _classes()
    refuse_unknown_options(
        {"numEnvs": 4, "envManager": "subprocess"},
        gym.episode_settings,
        "startEpisode",
        "GymOrchestrator",
    )
    with pytest.raises(InvalidRequest, match="'envManager'.*GameOrchestrator"):
        refuse_unknown_options(
            {"numEnvs": 4, "envManager": "subprocess"},
            game.episode_settings,
            "startEpisode",
            "GameOrchestrator",
        )
    with pytest.raises(InvalidRequest, match="Did you mean 'numEpisodes'"):
        refuse_unknown_options(
            {"numEpisode": 4}, gym.episode_settings, "startEpisode", "GymOrchestrator"
        )
    with pytest.raises(InvalidRequest, match="'league'"):
        refuse_unknown_options(
            {"id": "x", "league": {}}, gym.env_settings, "env", "GymOrchestrator"
        )


def test_a_new_player_type_is_declared_by_its_class_alone():
    """Writing an ActivePlayer subclass with a `kind` registers it: league settings accept it
    and league.json names it."""
    from dataclasses import dataclass

    from mistk_rl.league.manager import LeagueManager
    from mistk_rl.league.player import PLAYER_TYPES, MainPlayer
    from mistk_rl.sdk.schemas import LeaguePlayerSpec

    @dataclass
    class Sparring(MainPlayer):
        kind = "test_sparring"

    try:
        assert LeaguePlayerSpec(id="s", type="test_sparring").type == "test_sparring"
        league = LeagueManager.create(
            [{"type": "test_sparring", "id": "s", "checkpoint": "c"}], one_phase_step=10
        )
        assert league.state_dict()["active"][0]["type"] == "test_sparring"
        assert type(LeagueManager.from_state(league.state_dict()).active["s"]) is Sparring
    finally:
        PLAYER_TYPES._entries.pop("test_sparring")
    with pytest.raises(ValidationError, match="Did you mean 'main_exploiter'"):
        LeaguePlayerSpec(id="s", type="main_exploitr")


def test_a_null_option_is_not_set_wherever_it_belongs():
    """The spec's nullable options: null means "not set", for any orchestrator."""
    from mistk_rl.service.handlers import refuse_unknown_options

    gym, game, _ = _classes()
    assert refuse_unknown_options(
        {"numEpisodes": 2, "maxSteps": None, "lineup": None},
        game.episode_settings,
        "startEpisode",
        "GameOrchestrator",
    ) == {"numEpisodes": 2}
    assert refuse_unknown_options(
        {"id": "x", "league": None}, gym.env_settings, "env", "GymOrchestrator"
    ) == {"id": "x"}
