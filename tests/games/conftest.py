"""Fixtures of the game tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import RunConfig
from harness.run import run
from tests.games.test_games_harness import SELF_PLAY


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """A tic-tac-toe self-play run, short: its learner's checkpoint is a ladder player
    and an exploiter's target."""
    where = tmp_path_factory.mktemp("trained")
    config = {
        **SELF_PLAY,
        "agents": [{k: v for k, v in SELF_PLAY["agents"][0].items() if k != "save_path"}]
        + SELF_PLAY["agents"][1:],
        "game_training": {"agent_steps": 150, "eval_every": 150, "num_envs": 8},
        "evaluation": {
            **SELF_PLAY["evaluation"],
            "against": [{"opponent": "random", "games_per_seat": 2}],
        },
    }
    run(RunConfig.model_validate(config), where / "selfplay", say=lambda m: None, quiet=True)
    return where / "selfplay"
