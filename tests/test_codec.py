"""The binary tensor encoding: round trips, refusal of malformed bodies, and the same answers
as JSON over a real service."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from mistk_rl.errors import InvalidRequest
from mistk_rl.wire import codec
from tests.conftest import RANDOM_AGENT


def test_round_trip_keeps_arrays_and_structure():
    body = {
        "obs": {"a": np.arange(4, dtype=np.float32), "b": np.ones(4, np.float32)},
        "replay": {
            "prevObs": {"a": [0.5, 1, 2, 3]},
            "actions": {"a": 1},
            "rewards": {"a": 1.0},
            "newObs": {"a": np.zeros(4)},
            "terminated": {"a": False},
            "truncated": {"a": True},
        },
        "mode": "collect",
    }
    back = codec.decode(codec.encode(body))
    assert back["mode"] == "collect"
    assert set(back["obs"]) == {"a", "b"} and back["obs"]["a"].dtype == np.float32
    np.testing.assert_array_equal(back["obs"]["a"], body["obs"]["a"])
    assert back["replay"]["actions"]["a"] == 1 and back["replay"]["truncated"]["a"]
    np.testing.assert_array_equal(back["replay"]["prevObs"]["a"], [0.5, 1, 2, 3])


def test_replayed_rows_are_copies_not_views_into_the_request_body():
    """An agent keeps replayed observations (a replay buffer): a view would keep each whole
    request body alive with it."""
    from mistk_rl.service.handlers.agent import _replay_batch, _SpaceChecks

    replay = {
        "prevObs": {"a": np.zeros(4), "b": np.ones(4)},
        "actions": {"a": 0, "b": 1},
        "rewards": {"a": 1.0, "b": 0.0},
        "newObs": {"a": np.ones(4), "b": np.zeros(4)},
        "terminated": {"a": False, "b": True},
    }
    wire = codec.decode(codec.encode({"replay": replay}))["replay"]
    batch = _replay_batch(wire, _SpaceChecks.of(None, None))
    for entity in ("a", "b"):
        np.testing.assert_array_equal(batch.prev_obs[entity], replay["prevObs"][entity])
        assert not np.shares_memory(batch.prev_obs[entity], wire["prevObs"].array)
        assert not np.shares_memory(batch.new_obs[entity], wire["newObs"].array)


def test_binary_and_json_carry_the_same_arrays():
    rng = np.random.default_rng(0)
    obs = {f"e{i}": rng.normal(size=(3, 2)) for i in range(5)}
    back = codec.decode(codec.encode({"obs": obs}))["obs"]
    for key, value in obs.items():
        np.testing.assert_array_equal(back[key], np.asarray(value.tolist()))


def _dict_obs(i: int) -> dict:
    return {"tree_reps": np.full(5, i, np.float32), "real_states": np.full((4, 7, 7), i, np.uint8)}


def _message(maps: dict, payload: bytes = bytes(64)) -> bytes:
    header = json.dumps({"maps": maps, "values": {}}).encode()
    return struct.pack("<I", len(header)) + header + payload


def test_dict_observations_keep_every_key_and_dtype():
    """A map of dict observations travels as one stacked array per key, in its own dtype,
    in the body and in the replay alike; decoding gives what a JSON body would."""
    obs = {f"p:{i}": _dict_obs(i) for i in range(3)}
    body = {
        "obs": obs,
        "actionMask": {k: [1, 0] for k in obs},
        "replay": {
            "prevObs": obs,
            "newObs": obs,
            "actions": {k: 1 for k in obs},
            "rewards": {k: 0.5 for k in obs},
            "terminated": {k: False for k in obs},
        },
    }
    back = codec.decode(codec.encode(body))
    for field in (back["obs"], back["replay"]["prevObs"], back["replay"]["newObs"]):
        assert set(field.array) == {"tree_reps", "real_states"}
        assert field.array["real_states"].shape == (3, 4, 7, 7)
        for entity, value in obs.items():
            assert set(field[entity]) == set(value)
            for key in value:
                assert field[entity][key].dtype == value[key].dtype
                np.testing.assert_array_equal(field[entity][key], value[key])
    assert back["replay"]["actions"]["p:1"] == 1 and back["actionMask"].array.shape == (3, 2)


def test_dict_observations_of_one_map_must_share_their_keys():
    with pytest.raises(ValueError, match="same keys"):
        codec.encode({"obs": {"a": _dict_obs(0), "b": {"tree_reps": np.zeros(5)}}})
    with pytest.raises(ValueError, match="same keys"):
        codec.encode({"obs": {"a": _dict_obs(0), "b": np.zeros(5)}})


def test_dict_observations_in_one_step_cross_the_handlers_as_their_spaces_dtypes():
    """Checked against the registered Dict space, then each key cast to its subspace's
    dtype: JSON numbers and binary rows give the agent the same uint8 planes."""
    from gymnasium import spaces

    from mistk_rl.service.handlers.agent import _SpaceChecks

    space = spaces.Dict(
        {
            "tree_reps": spaces.Box(-np.inf, np.inf, (5,), np.float32),
            "real_states": spaces.Box(0, 255, (4, 7, 7), np.uint8),
        }
    )
    checks = _SpaceChecks.of(space, spaces.Discrete(2))
    obs = {f"p:{i}": _dict_obs(i) for i in range(6)}
    as_json = {e: {k: v.tolist() for k, v in o.items()} for e, o in obs.items()}
    for wire in (codec.decode(codec.encode({"obs": obs}))["obs"], as_json):
        got = checks.observations(wire, "obs")
        for entity, value in obs.items():
            assert got[entity]["real_states"].dtype == np.uint8
            assert got[entity]["tree_reps"].dtype == np.float32
            np.testing.assert_array_equal(got[entity]["real_states"], value["real_states"])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x05\x00\x00\x00{}",
        b"\xff\xff\x00\x00{}",
        codec.encode({"obs": {"a": [1.0, 2.0]}})[:-4],
        codec.encode({"obs": {"a": _dict_obs(1)}})[:-4],
        _message({"obs": {"entities": ["a"], "keys": {}}}),
        _message(
            {
                "obs": {
                    "entities": ["a", "b"],
                    "keys": {"k": {"dtype": "<f4", "shape": [1, 2], "offset": 0}},
                }
            }
        ),
    ],
)
def test_malformed_bodies_are_invalid_requests(data):
    with pytest.raises(InvalidRequest, match="malformed"):
        codec.decode(data)


def test_ragged_or_text_values_cannot_be_encoded():
    with pytest.raises(ValueError):
        codec.encode({"obs": {"a": "text"}})


def test_binary_step_path_over_http(launch):
    service = launch("agent", RANDOM_AGENT)
    agent = service.client()
    assert "tensors" in agent.api_version().capabilities
    agent.initialize(hyperparameters={"seed": 1})
    agent.build_model()
    agent.agent_registered({"name": "p", "actionSpace": {"type": "Discrete", "n": 3}})
    obs = {f"p:{i}": np.full(4, i, np.float32) for i in range(64)}
    agent.episode_started(obs)
    agent.binary = True
    actions = agent.step(obs)
    assert set(actions) == set(obs) and all(0 <= int(a) < 3 for a in actions.values())
    replay = {
        "prevObs": obs,
        "actions": actions,
        "rewards": {k: 1.0 for k in obs},
        "newObs": obs,
        "terminated": {k: False for k in obs},
        "truncated": {k: False for k in obs},
    }
    assert set(agent.step(obs, replay=replay)) == set(obs)
    assert agent.replay_action(replay).state == "in_episode"
    masked = agent.get_action({"p:0": obs["p:0"]}, action_mask={"p:0": [0, 0, 1]})
    assert int(masked["p:0"]) == 2
    bad = dict(replay, rewards={k: 1.0 for k in list(obs)[:3]})  # entities do not match
    with pytest.raises(Exception, match="rewards names entities"):
        agent.step(obs, replay=bad)
    assert agent.status().state == "in_episode"
