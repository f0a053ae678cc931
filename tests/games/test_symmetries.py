"""Board symmetries: an image of a position is the position the mapped moves reach."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pettingzoo.classic import connect_four_v3, tictactoe_v3

from mistk_rl.games.symmetries import symmetries_for


def _play(make, moves):
    env = make()
    env.reset(seed=0)
    for move in moves:
        env.step(int(move))
    observed = env.observe(env.agent_selection)
    env.close()
    return observed["observation"], observed["action_mask"]


@pytest.mark.parametrize(
    "game, make, moves, images",
    [
        ("classic/tictactoe-v3", tictactoe_v3.env, [0, 4, 5], 8),
        ("tictactoe_v3", tictactoe_v3.env, [1, 2, 7, 3], 8),
        ("classic/connect_four-v3", connect_four_v3.env, [0, 3, 3, 6, 1], 2),
    ],
)
def test_images_are_the_positions_the_mapped_moves_reach(game, make, moves, images):
    sym = symmetries_for(game)
    obs, mask = _play(make, moves)
    action = int(np.flatnonzero(mask)[0])
    transition = {
        "obs": obs,
        "next_obs": obs,
        "action": torch.tensor(action),
        "reward": 0.0,
        "terminated": False,
        "next_action_mask": mask,
    }
    out = sym.augment(transition)
    assert len(out) == images and out[0]["obs"].tobytes() == obs.tobytes()
    for (moved, _), image in zip(sym.moved, out):
        reached, legal = _play(make, [moved[m] for m in moves])
        np.testing.assert_array_equal(image["obs"], reached)
        np.testing.assert_array_equal(image["next_action_mask"], legal)
        assert legal[int(image["action"])]  # the mapped move is legal there
        assert isinstance(image["action"], torch.Tensor)


def test_symmetric_positions_are_stored_once():
    sym = symmetries_for("classic/tictactoe-v3")
    empty = np.zeros((3, 3, 2), dtype=np.int8)
    centre = {"obs": empty, "next_obs": empty, "action": np.int64(4), "reward": 0.0}
    corner = dict(centre, action=np.int64(0))
    assert len(sym.augment(centre)) == 1  # the centre of the empty board: one image
    assert sorted(int(t["action"]) for t in sym.augment(corner)) == [0, 2, 6, 8]
    assert symmetries_for("classic/rps-v2") is None and symmetries_for(None) is None


def test_a_dqn_agent_stores_every_image_of_a_move(tmp_path):
    from agents.dqn_agent import DQNAgent
    from mistk_rl.errors import InvalidRequest
    from mistk_rl.framework.agent import ReplayBatch
    from mistk_rl.spaces import space_from_dict
    from tests.entity_steps import EntitySteps

    agent = DQNAgent()
    agent.data_dir = tmp_path
    agent.do_initialize({}, {"seed": 0, "augment": "board_symmetries", "log_every": 0})
    agent.do_build_model(None)
    with pytest.raises(InvalidRequest, match="no symmetries"):
        agent.validate_registration_properties({"game": "CartPole-v1"})
    agent.validate_registration_properties({"game": "classic/tictactoe-v3"})
    from mistk_rl.spaces import space_to_dict

    board = tictactoe_v3.env()
    spaces = {
        "observationSpace": space_to_dict(board.observation_space("player_1")["observation"]),
        "actionSpace": space_to_dict(board.action_space("player_1")),
    }
    agent.observation_space, agent.action_space = (space_from_dict(spaces[k]) for k in spaces)
    agent.do_agent_registered(
        {"name": "p", "properties": {"game": "classic/tictactoe-v3"}, **spaces}
    )
    obs, _ = _play(tictactoe_v3.env, [0, 4, 5])
    after, mask = _play(tictactoe_v3.env, [0, 4, 5, 1])
    agent.mode = "collect"
    EntitySteps(agent).replay_action(
        ReplayBatch(
            prev_obs={"p": obs},
            actions={"p": np.int64(1)},
            rewards={"p": 0.0},
            new_obs={"p": after},
            terminated={"p": False},
            truncated={"p": False},
            new_action_mask={"p": mask},
        )
    )
    assert agent.learner.env_steps == 1  # one move...
    assert agent.trainer.buffer.count() == 8  # ...stored under the 8 symmetries
