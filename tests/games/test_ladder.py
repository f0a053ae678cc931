"""`mistk-rl ladder`: trained players and built-in opponents in a round robin over HTTP,
rated with intervals (the fit itself: tests/league/test_bradley_terry.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from harness.cli import main as cli
from harness.config import RunConfig, RunConfigError
from harness.ladder import group_scores
from harness.ladder_players import LADDER_MODEL, ladder_config
from harness.stats import crossed_bootstrap
from mistk_rl.league.bradley_terry import PairRecord


def test_a_ladder_plays_every_pair_in_both_seats_and_rates_them(trained, tmp_path, capsys):
    out = tmp_path / "ladder"
    code = cli(
        [
            "ladder",
            f"learner={trained}",
            "--opponents",
            "random,tictactoe_alphabeta2",
            "--games-per-seat",
            "6",
            "--group",
            "trained=learner",
            "--group",
            "builtin=random,tictactoe_alphabeta2",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    ladder = json.loads((out / "ladder.json").read_text())
    # three players: three pairs, each in both seat orders, 6 games a cell
    pairs = {(c["first"], c["second"]) for c in ladder["cells"]}
    assert len(ladder["cells"]) == 6 and len(pairs) == 6
    assert all(c["win"] + c["draw"] + c["loss"] == 6 for c in ladder["cells"])
    ratings = ladder["ratings"]
    assert set(ratings) == {"learner", "random", "tictactoe_alphabeta2"}
    assert ladder["anchor"] == "random" and ratings["random"]["rating"] == 0.0
    for r in ratings.values():
        assert r["games"] == 24 and r["low"] <= r["rating"] <= r["high"]
    # a searcher that never misses a win or a block scores more than random against the rest
    assert ratings["tictactoe_alphabeta2"]["rating"] > 0
    # the learner played the model the run left, copied into its data dir here
    checkpoint = json.loads((trained / "progress.json").read_text())["checkpoints"]["learner"]
    copied = out / "data" / "learner" / LADDER_MODEL
    assert copied.read_bytes() == (trained / "data" / "learner" / checkpoint).read_bytes()
    said = capsys.readouterr().out
    assert "ratings (Elo points above random" in said and "first seat's advantage" in said
    # the groups compared as wholes: the learner's 24 games against the two built-ins
    (group,) = ladder["groups"]
    assert (group["group"], group["against"], group["games"]) == ("trained", "builtin", 24)
    learner_points = sum(
        c["win"] + c["draw"] / 2 if c["first"] == "learner" else c["loss"] + c["draw"] / 2
        for c in ladder["cells"]
        if "learner" in (c["first"], c["second"])
    )
    assert group["score"] == pytest.approx(learner_points / 24)
    assert group["low"] <= group["score"] <= group["high"]
    assert "group trained against builtin: score" in said
    assert (out / "ratings.png").stat().st_size > 1000
    assert (out / "headtohead.png").stat().st_size > 1000
    rows = (out / "ladder.csv").read_text().splitlines()
    assert rows[0] == "player,rating,low,high,score,games" and len(rows) == 4
    # its config.yaml is a ladder `mistk-rl run` plays again
    again = yaml.safe_load((out / "config.yaml").read_text())
    assert again["ladder"]["players"] == ["learner", "random", "tictactoe_alphabeta2"]
    assert again["agents"][0]["model_path"] == LADDER_MODEL and not again["agents"][0]["train"]


def test_bad_ladders_are_refused_before_anything_starts(trained, tmp_path, capsys):
    assert cli(["ladder", "--opponents", "random", "--out", str(tmp_path / "a")]) == 2
    assert "two players or more" in capsys.readouterr().err
    assert cli(["ladder", "--opponents", "random,nobody", "--game", "classic/tictactoe-v3"]) == 1
    assert "'nobody' is not a built-in opponent" in capsys.readouterr().err
    with pytest.raises(RunConfigError, match="give --game ID"):
        ladder_config([], ["random", "connect4_winblock"], tmp_path / "b")
    with pytest.raises(RunConfigError, match="its players play classic/connect_four-v3, classic/"):
        ladder_config([str(trained)], [], tmp_path / "e", game="classic/connect_four-v3")
    assert cli(["ladder", f"x={trained}", "--opponents", "random", "--group", "x"]) == 1
    assert "NAME=PLAYER,PLAYER" in capsys.readouterr().err
    with pytest.raises(ValueError, match="each member one of ladder.players"):
        ladder_config([f"x={trained}"], ["random"], tmp_path / "f", groups={"a": ["x"], "b": ["y"]})
    with pytest.raises(ValueError, match="two groups or more"):
        ladder_config([f"x={trained}"], ["random"], tmp_path / "g", groups={"a": ["x"]})
    with pytest.raises(RunConfigError, match="two players have one name"):
        ladder_config([f"x={trained}", f"x={trained}"], [], tmp_path / "c")
    with pytest.raises(RunConfigError, match="is not a league run"):
        ladder_config([str(trained)], ["random"], tmp_path / "d", snapshots=2)
    with pytest.raises(ValueError, match="ladder.anchor .nobody."):
        RunConfig.model_validate(
            {
                "orchestrator": {"target": "x:Y", "env": {"id": "classic/tictactoe-v3"}},
                "agents": [{"name": "a", "target": "x:A"}, {"name": "b", "target": "x:B"}],
                "ladder": {"players": ["a", "b"], "anchor": "nobody"},
            }
        )


def test_a_league_runs_snapshots_join_as_players(trained, tmp_path):
    """``--snapshots K``: the league's last K snapshots of the agent, by their moves."""
    league = tmp_path / "league"
    orchestrator = league / "data" / "orchestrator" / "league"
    orchestrator.mkdir(parents=True)
    (league / "config.yaml").write_text((trained / "config.yaml").read_text())
    historical = []
    for k, steps in enumerate((300, 100, 200)):
        path = f"league/snap{k}.pt"
        (league / "data" / "orchestrator" / path).write_bytes(b"w%d" % k)
        historical.append(
            {
                "player_id": f"learner_{steps}",
                "parent_id": "learner",
                "checkpoint_path": path,
                "total_agent_step": steps,
            }
        )
    historical.append(
        {"player_id": "random", "parent_id": "", "checkpoint_path": "", "fixed": True}
    )
    (orchestrator / "league.json").write_text(json.dumps({"historical": historical}))
    learner = league / "data" / "learner"
    learner.mkdir(parents=True)
    progress = json.loads((trained / "progress.json").read_text())
    (learner / progress["checkpoints"]["learner"]).parent.mkdir(parents=True)
    (learner / progress["checkpoints"]["learner"]).write_bytes(b"final")
    (league / "progress.json").write_text(json.dumps(progress))
    config = ladder_config([f"lg={league}"], ["random"], tmp_path / "out", snapshots=2)
    assert config.ladder is not None
    assert config.ladder.players == ["lg", "lg:learner_200", "lg:learner_300", "random"]
    copied = tmp_path / "out" / "data" / "lg:learner_300" / LADDER_MODEL
    assert copied.read_bytes() == b"w0"


def _cell(first: str, second: str, win: int, draw: int, loss: int) -> PairRecord:
    return PairRecord(first, second, win, draw, loss)


def test_groups_are_scored_over_every_pairing_and_seat():
    # a0 scores .75 against each b (both seats), a1 .25: the groups are even, and the
    # interval, which resamples the a's, is wide; the pairings are reported one by one
    cells = []
    for b in ("b0", "b1"):
        cells += [_cell("a0", b, 30, 0, 10), _cell(b, "a0", 10, 0, 30)]
        cells += [_cell("a1", b, 10, 0, 30), _cell(b, "a1", 30, 0, 10)]
    (g,) = group_scores(cells, {"a": ["a0", "a1"], "b": ["b0", "b1"]}, resamples=400)
    assert g["score"] == pytest.approx(0.5) and g["games"] == 320
    assert g["pairings"] == {"a0 vs b0": 0.75, "a0 vs b1": 0.75, "a1 vs b0": 0.25, "a1 vs b1": 0.25}
    assert g["low"] < 0.3 and g["high"] > 0.7


def test_the_crossed_bootstrap_carries_both_sides_spread():
    rng = np.random.default_rng(0)
    even = np.tile([60, 0, 40], (3, 3, 1))  # every pairing .6
    score, low, high = crossed_bootstrap(even, resamples=500, seed=1)
    assert score == pytest.approx(0.6) and 0.55 < low < 0.6 < high < 0.65  # the games alone
    spread = even.copy()
    spread[:, 0] = [90, 0, 10]  # one column far from the others: more spread, wider
    _, low2, high2 = crossed_bootstrap(spread, resamples=500, seed=1)
    assert high2 - low2 > 2 * (high - low)
    # the interval covers the truth about as often as it says (rows and columns random)
    covered = 0
    for k in range(40):
        row = rng.normal(0, 0.05, 3)[:, None]
        col = rng.normal(0, 0.05, 3)[None, :]
        p = np.clip(0.55 + row + col, 0, 1)
        wins = rng.binomial(200, p)
        grid = np.stack([wins, np.zeros_like(wins), 200 - wins], axis=-1)
        _, lo, hi = crossed_bootstrap(grid, resamples=300, seed=k)
        covered += lo <= 0.55 <= hi
    assert covered >= 28  # nominal 95%; with three a side a bootstrap runs somewhat short


@pytest.mark.long(40)
def test_checkpoints_as_players_are_rated_over_moves_and_groups_compared_move_by_move(
    trained, tmp_path
):
    """``--checkpoints``: each run's kept checkpoints play as LABEL:step-N; groups of runs
    are compared checkpoint by checkpoint, and ratings_over_moves.png is drawn."""
    import shutil

    runs = []
    for label in ("a", "b"):
        copy = tmp_path / label
        shutil.copytree(trained, copy)
        kept = copy / "data" / "learner" / "checkpoints"
        first = sorted(kept.glob("step-*.pt"))[0]
        shutil.copyfile(first, kept / "step-99999.pt")  # a later one (same weights)
        runs.append(f"{label}={copy}")
    out = tmp_path / "ladder"
    command = ["ladder", *runs, "--checkpoints"]
    command += ["--group", "x=a", "--group", "y=b", "--games-per-seat", "4"]
    assert cli([*command, "--out", str(out), "--quiet"]) == 0
    ladder = json.loads((out / "ladder.json").read_text())
    steps = sorted(int(p.name.removeprefix("step-")[:-3]) for p in kept.glob("step-*.pt"))
    players = [f"{label}:step-{n}" for label in "ab" for n in steps]
    assert sorted(ladder["ratings"]) == sorted(players)
    assert [g["at"] for g in ladder["groups"]] == list(range(len(steps)))
    for k, g in enumerate(ladder["groups"]):
        assert list(g["pairings"]) == [f"a:step-{steps[k]} vs b:step-{steps[k]}"]
        assert g["games"] == 8
    assert (out / "ratings_over_moves.png").stat().st_size > 1000
    for kept_one in kept.glob("step-*.pt"):
        kept_one.unlink()
    with pytest.raises(RunConfigError, match="kept no checkpoint of learner"):
        ladder_config([str(tmp_path / "b")], [], tmp_path / "c", checkpoints=True)


def test_runs_checkpoints_are_compared_from_the_last_one():
    """A run that kept fewer checkpoints (its earliest dropped) is compared on the ones it
    has: the last against the last, the one before against the one before."""
    a = ["a:step-100", "a:step-200", "a:step-300"]
    b = ["b:step-200", "b:step-300"]
    cells = [_cell(p, q, 3, 0, 1) for p in a for q in b] + [
        _cell(q, p, 1, 0, 3) for p in a for q in b
    ]
    scores = group_scores(cells, {"x": ["a"], "y": ["b"]}, resamples=10, players=a + b)
    assert [list(g["pairings"]) for g in scores] == [
        ["a:step-200 vs b:step-200"],
        ["a:step-300 vs b:step-300"],
    ]
    assert [g["at"] for g in scores] == [0, 1] and all(g["score"] == 0.75 for g in scores)
