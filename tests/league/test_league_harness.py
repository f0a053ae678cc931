"""The harness's league pieces: targets that stop a run, the evaluation by seat order, the
league config's checks, the plots."""

from __future__ import annotations

import numpy as np
import pytest

from harness.config import RunConfigError, Target, load_config
from harness.games import meets
from harness.league import (
    _pyplot,
    by_seat_order,
    payoff_figure,
    plot_payoff,
    plot_ratings,
    table_text,
)
from mistk_rl.sdk.schemas import LeagueSettings
from tests.conftest import REPO

REPORT = {
    "random": {
        "exhaustive": True,
        "seats": {
            "player_1": {"win": 0.99, "draw": 0.01, "loss": 0.0, "lines": 90, "lost_lines": 0},
            "player_2": {"win": 0.85, "draw": 0.14, "loss": 0.01, "lines": 500, "lost_lines": 2},
        },
    },
    "tictactoe_perfect": {
        "exhaustive": True,
        "seats": {
            "player_1": {"win": 0.0, "draw": 1.0, "loss": 0.0, "lines": 2, "lost_lines": 0},
            "player_2": {"win": 0.0, "draw": 1.0, "loss": 0.0, "lines": 183, "lost_lines": 0},
        },
    },
}


def test_targets_per_seat_and_every_seat():
    assert not meets(REPORT, [])  # no targets: never stop early
    assert meets(
        REPORT,
        [
            Target(opponent="random", seat="player_1", min_win=0.95, max_lost_lines=0),
            Target(opponent="tictactoe_perfect", max_lost_lines=0),
        ],
    )
    assert not meets(REPORT, [Target(opponent="random", max_lost_lines=0)])  # player_2 lost 2
    assert not meets(REPORT, [Target(opponent="random", seat="player_2", min_win=0.9)])
    assert meets(REPORT, [Target(opponent="random", seat="player_2", max_loss=0.01)])
    assert not meets(REPORT, [Target(opponent="random", max_loss=0.0)])


def test_evaluation_by_seat_order():
    named = by_seat_order(REPORT)
    assert named["vs_random"]["first"] == {
        "win": 0.99,
        "draw": 0.01,
        "loss": 0.0,
        "lines": 90,
        "lost_lines": 0,
    }
    assert named["vs_perfect"]["second"]["lost_lines"] == 0
    assert set(named) == {"vs_random", "vs_perfect"}


def test_league_configs_load_and_are_checked(tmp_path):
    for name in (
        "tictactoe_league.yaml",
        "connect4_league.yaml",
        "connect4_league_heldout.yaml",
        "cartpole_solo_league.yaml",
    ):
        config = load_config(REPO / "configs" / name)
        assert config.orchestrator.env.league and len(config.workers) == 2
        assert [a.name for a in config.agents if a.train] == [
            p["id"] for p in config.orchestrator.env.league["players"]
        ]
        # what the league orchestrator's initialize will check (the harness adds workers)
        LeagueSettings.model_validate(
            {**config.orchestrator.env.league, "workers": ["http://127.0.0.1:1"]}
        )
    text = (REPO / "configs" / "tictactoe_league.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace(
            "- {opponent: tictactoe_perfect, max_lost_lines: 0}",
            "- {opponent: nobody, max_lost_lines: 0}",
        )
    )
    with pytest.raises(RunConfigError, match="nobody"):
        load_config(bad)
    bad.write_text(text.replace("    league:\n", "    leag:\n"))
    with pytest.raises(RunConfigError):
        load_config(bad)


def test_the_table_prints_best_first():
    league = {
        "jobs": {"launched": 3},
        "players": [
            {"id": "main", "kind": "MainPlayer", "steps": 100, "exposure": 3.0, "elo": 1250.4},
            {
                "id": "main_0_0",
                "kind": "HistoricalPlayer",
                "steps": 0,
                "exposure": 1.0,
                "elo": 1150.0,
            },
        ],
    }
    text = table_text(league).splitlines()
    assert text[0].startswith("league: 3 jobs, 2 players")
    assert text[2].split() == ["main", "MainPlayer", "100", "3.00", "1250"]
    assert len(text) == 4  # (no mix: no lines for it)
    mix = {"player": "main", "branch": "pfsp", "opponent": "snapshot of main", "jobs": 2}
    mix.update(games=128, score=0.7344, moves=1100, share=0.25)
    league["jobs"]["mix"] = [mix, {**mix, "branch": "sp", "opponent": "itself", "share": None}]
    text = table_text(league).splitlines()
    assert text[4].startswith("what each player trained against")
    assert text[6].split() == ["main", "pfsp", "snapshot", "of", "main", "128", "0.734"] + [
        "1100",
        "25.0%",
    ]
    assert text[7].split()[-1] == "-"


def test_plots_are_written(tmp_path):
    payoff = {
        "ids": ["main", "main_0_0"],
        "winRate": [[0.5, 0.8], [0.2, 0.5]],
        "games": [[0, 30], [30, 0]],
    }
    figure = payoff_figure(payoff, "ttt (seed 3)")
    image = figure.axes[0].images[0].get_array()
    assert image.mask.tolist() == [[True, False], [False, True]]  # never played: blank
    assert figure.axes[0].get_title().startswith("ttt (seed 3): payoff")
    plot_payoff(payoff, tmp_path / "payoff.png")
    evals = [
        {"agent_steps": s, "league": [{"id": "main", "exposure": e, "elo": 1200 + e}]}
        for s, e in ((10, 1.0), (20, 2.0))
    ]
    plot_ratings(evals, tmp_path / "ratings.png")
    assert (tmp_path / "payoff.png").stat().st_size > 1000
    assert (tmp_path / "ratings.png").stat().st_size > 1000


def test_the_payoff_figure_stays_one_size_however_large_the_league_grows():
    """A league gains a snapshot every phase and the harness draws its payoff at every
    evaluation: the figure stops growing at its bound (its cells shrink), the matrix is all
    there, and the ticks name every k-th player once there are too many to read."""
    from harness.league import LABELLED_PLAYERS, MAX_FIGURE_INCHES

    def figure(n: int):
        rng = np.random.default_rng(n)
        return payoff_figure(
            {
                "ids": [f"p{i}" for i in range(n)],
                "winRate": rng.random((n, n)).tolist(),
                "games": rng.integers(1, 9, (n, n)).tolist(),
            }
        )

    sizes = {}
    for n in (3, 30, 150):
        fig = figure(n)
        sizes[n] = tuple(fig.get_size_inches())
        assert fig.axes[0].images[0].get_array().shape == (n, n)
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert labels[0] == "p0" and len(labels) <= LABELLED_PLAYERS
        assert len(fig.axes[0].texts) == (9 if n == 3 else 0)  # annotated while legible
        _pyplot().close(fig)
    assert sizes[3] < sizes[30] == sizes[150] == (MAX_FIGURE_INCHES + 1, MAX_FIGURE_INCHES)
    assert len(labels) == 50  # 150 players: every third named


def test_the_payoff_figure_drawn_at_an_evaluation_is_freed_with_it(tmp_path):
    """Game training draws the league's payoff for TensorBoard at every evaluation; the
    figure (reference cycles) is freed then, not at the next full collection, which a
    long-running harness reaches rarely (the collector is off here, standing for that)."""
    import gc
    from types import SimpleNamespace

    from matplotlib.figure import Figure

    from harness.games import _GameSchedule
    from harness.training import tensorboard_writer

    payoff = {"ids": ["a", "b"], "winRate": [[0.5, 0.7], [0.3, 0.5]], "games": [[0, 9], [9, 0]]}
    schedule = _GameSchedule.__new__(_GameSchedule)  # (only what logging uses)
    schedule.title = "ttt"
    schedule.writer = tensorboard_writer(tmp_path / "tensorboard")
    schedule.orch = SimpleNamespace(
        get_league=lambda: SimpleNamespace(model_dump=lambda: {"payoff": payoff})
    )

    def figures() -> int:
        return sum(isinstance(o, Figure) for o in gc.get_objects())

    was = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        before = figures()
        for step in (10, 20, 30):
            schedule._log({"agent_steps": step, "evaluation": {}, "league": []})
        assert figures() == before
    finally:
        schedule.writer.close()
        if was:
            gc.enable()
    events = list((tmp_path / "tensorboard").iterdir())
    assert events and events[0].stat().st_size > 1000  # (the images were written)


def test_a_solo_league_config_trains_with_training_and_its_players_as_agents():
    import yaml
    from pydantic import ValidationError

    from harness.config import RunConfig

    config = load_config(REPO / "configs" / "cartpole_solo_league.yaml")
    assert config.orchestrator.env.solo_players() == ["fast", "slow"]
    assert config.training is not None and config.evaluator is None
    data = yaml.safe_load((REPO / "configs" / "cartpole_solo_league.yaml").read_text())
    games = {
        **data,
        "training": None,
        "game_training": {"agent_steps": 100},
        "evaluation": {"agent": "fast", "against": [{"opponent": "random", "exhaustive": True}]},
    }
    with pytest.raises(ValidationError, match="solo league plays no games"):
        RunConfig.model_validate(games)
    battle = yaml.safe_load(yaml.safe_dump(data))
    battle["orchestrator"]["env"]["league"]["players"][1] = {"id": "slow", "type": "main"}
    with pytest.raises(ValidationError, match="'training' with a league trains a solo league"):
        RunConfig.model_validate(battle)
    stranger = {**data, "agents": [data["agents"][0], {**data["agents"][1], "name": "other"}]}
    with pytest.raises(ValidationError, match=r"agents are its players \(fast, slow\)"):
        RunConfig.model_validate(stranger)
