"""Unit tests of the small library pieces: spaces, paths, atomic files, config, SDK errors."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from pydantic import TypeAdapter

from harness.config import RunConfigError, load_config, with_seed
from mistk_rl.errors import InvalidRequest
from mistk_rl.files import atomic_write_json, resolve_in
from mistk_rl.sdk.schemas import Space
from mistk_rl.spaces import coerce_action, space_from_dict, space_to_dict
from mistk_rl.wire.jsonable import to_jsonable

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "space",
    [
        spaces.Discrete(5, start=-1),
        spaces.Box(low=-1.0, high=2.0, shape=(3, 2), dtype=np.float32),
        gym.make("CartPole-v1").observation_space,  # infinite bounds
        spaces.MultiDiscrete([3, 4, 2]),
        spaces.MultiBinary(6),
    ],
)
def test_space_round_trip(space):
    data = json.loads(json.dumps(space_to_dict(space)))  # survives JSON (no inf)
    TypeAdapter(Space).validate_python(data)
    back = space_from_dict(data)
    assert type(back) is type(space) and back.shape == space.shape
    sample = space.sample()
    assert back.contains(
        np.asarray(sample, dtype=back.dtype) if not isinstance(space, spaces.Discrete) else sample
    )


def test_dict_space_round_trip():
    space = spaces.Dict(
        {
            "tree_reps": spaces.Box(-np.inf, np.inf, (5,), np.float32),
            "real_states": spaces.Box(0, 1, (4, 7, 7), np.uint8),
            "turn": spaces.Discrete(2),
        }
    )
    data = json.loads(json.dumps(space_to_dict(space)))
    TypeAdapter(Space).validate_python(data)
    back = space_from_dict(data)
    assert back == space and back["real_states"].dtype == np.uint8
    assert back.contains(space.sample())


@pytest.mark.parametrize(
    "space, match",
    [
        (spaces.Tuple((spaces.Discrete(2),)), "unsupported space"),
        (spaces.Dict({"a": spaces.Dict({"b": spaces.Discrete(2)})}), "Dict inside a Dict"),
        (spaces.Dict({"a b": spaces.Discrete(2)}), "does not match"),
        (spaces.Dict({"a": spaces.Tuple((spaces.Discrete(2),))}), "key 'a': unsupported space"),
    ],
)
def test_unsupported_space_is_refused(space, match):
    with pytest.raises(ValueError, match=match):
        space_to_dict(space)


def test_coerce_action():
    assert coerce_action(spaces.Discrete(3), 2) == 2
    assert coerce_action(spaces.Discrete(3), [1]) == 1
    assert coerce_action(spaces.Discrete(3, start=-1), np.int32(-1)) == -1
    box = spaces.Box(-1, 1, shape=(2,), dtype=np.float32)
    assert coerce_action(box, [0.5, -0.5]).dtype == np.float32
    for space, bad in (
        (spaces.Discrete(3), 3),
        (spaces.Discrete(3), -1),
        (spaces.Discrete(3), np.int64(7)),
        (spaces.Discrete(3), 1.5),
        (box, [2.0, 0.0]),
        (box, [0.0]),
        (spaces.Discrete(2), "a"),
    ):
        with pytest.raises(ValueError, match="not in the action space"):
            coerce_action(space, bad)


def test_resolve_in_keeps_paths_inside(tmp_path):
    assert resolve_in(tmp_path, "a/b.json") == (tmp_path / "a/b.json").resolve()
    assert resolve_in(tmp_path, str(tmp_path / "x")) == (tmp_path / "x").resolve()
    (tmp_path / "link").symlink_to("/etc")
    for bad in ("../x", "/etc/passwd", "a/../../x", "link/passwd"):
        with pytest.raises(InvalidRequest):
            resolve_in(tmp_path, bad)


def test_resolve_in_shares_one_outside_directory(tmp_path):
    data, league = tmp_path / "data", tmp_path / "league"
    data.mkdir()
    league.mkdir()
    shares = {"league": league}
    assert resolve_in(data, "league/snap/a.pt", shares) == (league / "snap/a.pt").resolve()
    assert resolve_in(data, "other/a.pt", shares) == (data / "other/a.pt").resolve()
    assert resolve_in(data, "league/a.pt") == (data / "league/a.pt").resolve()  # not shared
    for bad in ("league/../data/x", "league/../../x"):
        with pytest.raises(InvalidRequest):
            resolve_in(data, bad, shares)


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    target = tmp_path / "deep" / "r.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in target.parent.iterdir()] == ["r.json"]


def test_to_jsonable():
    value = {"a": np.arange(3, dtype=np.int64), "b": (np.float32(1.5), [np.bool_(True)])}
    assert to_jsonable(value) == {"a": [0, 1, 2], "b": [1.5, [True]]}


def test_example_config_loads():
    config = load_config(REPO / "configs" / "cartpole_random.yaml")
    assert config.orchestrator.env.id == "CartPole-v1" and config.agents[0].name == "player"


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "configs").rglob("*.yaml")),
    ids=lambda path: str(path.relative_to(REPO / "configs")),
)
def test_every_example_config_is_valid_down_to_the_hyperparameters(path):
    """A config a user copies must load, name service classes `serve` takes, and merge its
    agents' hyperparameters over their classes' defaults (a misplaced key is otherwise found
    only once services run)."""
    from mistk_rl.service.server import import_implementation

    config = load_config(path)
    orchestrators = [config.orchestrator, *config.workers, config.evaluator]
    for spec in orchestrators:
        if spec is not None and spec.target is not None:
            import_implementation("orchestrator", spec.target)
    for agent in config.agents:
        if agent.target is None:
            continue
        cls = import_implementation("agent", agent.target)
        if hasattr(cls, "compile_config"):
            cls.compile_config(agent.hyperparameters)


def test_with_seed_sets_every_seed_but_the_evaluation_ones():
    dqn = with_seed(load_config(REPO / "configs" / "cartpole_dqn.yaml"), 7)
    assert dqn.agents[0].hyperparameters["seed"] == 7 and dqn.training.seed == 7
    assert dqn.training.eval_seed == 10_000  # evaluations stay comparable across seeds
    assert dqn.agents[0].hyperparameters["policy"]["nstep"] == 5  # the rest is kept
    play = with_seed(load_config(REPO / "configs" / "cartpole_random.yaml"), 3)
    assert [block.seed for block in play.episodes] == [3] * len(play.episodes)
    with pytest.raises(RunConfigError, match="seed"):
        with_seed(play, -1)
    league = with_seed(load_config(REPO / "configs" / "tictactoe_league.yaml"), 5)
    assert [a.hyperparameters["seed"] for a in league.agents] == [5, 6, 7, 8, 9]
    assert league.orchestrator.env.league["seed"] == 5 and league.game_training.seed == 5


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "orchestrator: {target: a:B, env: {id: X}}\nagents: [{name: p, target: a:B}]\n"
            "episodez: []\n",
            r"episodez: unknown key \(known here: agents, .*\)\. Did you mean "
            r"'episodes'\?",
        ),
        (
            "orchestrator: {target: a:B, env: {id: X}}\n"
            "agents: [{name: p, target: a:B, hyperparamters: {}}]\n",
            r"agents\.0\.hyperparamters: unknown key .* Did you mean 'hyperparameters'\?",
        ),
        (
            "orchestrator: {target: a:B, url: http://x, env: {id: X}}\n"
            "agents: [{name: p, target: a:B}]\n",
            "exactly one of",
        ),
        ("orchestrator: {target: a:B, env: {id: X}}\nagents: []\n", "agents"),
        ("orchestrator: [unclosed\n", "not valid YAML"),
    ],
)
def test_config_errors_name_the_problem(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(RunConfigError, match=message):
        load_config(path)


def test_atomic_writes_get_the_mode_open_would_give(tmp_path):
    """mkstemp makes 0600 files; results and checkpoints must be readable as usual."""
    import os

    from mistk_rl.files import _UMASK

    atomic_write_json(tmp_path / "r.json", {"a": 1})
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o666 & ~_UMASK
    assert _UMASK == os.umask(_UMASK)  # read without changing it


def test_episode_quotas_split_evenly_with_the_remainder_first():
    """Each env copy's share of an episode limit: short episodes cannot crowd out long ones."""
    from mistk_rl.framework.orchestrator import episode_quotas

    assert episode_quotas(5, 2) == [3, 2]
    assert episode_quotas(7, 3) == [3, 2, 2] and sum(episode_quotas(100, 7)) == 100
    assert episode_quotas(None, 2) == [float("inf"), float("inf")]


def test_played_counts_what_a_call_moved():
    from mistk_rl.sdk.client import Played
    from mistk_rl.sdk.schemas import OrchestratorProgress, Results

    played = Played(
        Results(),
        OrchestratorProgress(env_steps=10, agent_steps={"a": 4}),
        OrchestratorProgress(env_steps=25, agent_steps={"a": 9, "b": 3}),
    )
    assert played.env_steps == 15 and played.episodes == []
    assert played.agent_steps("a") == 5 and played.agent_steps("b") == 3
    assert played.agent_steps("nobody") == 0


def test_next_eval_point_stops_at_multiples_and_the_budget():
    from harness.loop import next_eval_point

    assert next_eval_point(0, 100, 1000) == 100
    assert next_eval_point(130, 100, 1000) == 200  # a block that overshot: the next multiple
    assert next_eval_point(950, 100, 1000) == 1000 and next_eval_point(200, 100, 250) == 250
