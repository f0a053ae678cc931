"""`mistk-rl compare`: run directories grouped and summarised over their seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.compare import compare, load_run, summarise
from harness.config import RunConfigError


def _game_run(root: Path, name: str, seed: int, wins: list[tuple[int, float, float]]) -> Path:
    """A game run's directory: evaluations at (agent steps, first seat, second seat) wins
    against win-block."""
    run = root / f"{name}-s{seed}"
    run.mkdir()
    (run / "config.yaml").write_text(
        yaml.safe_dump({"name": name, "game_training": {"eval_every": 100_000, "seed": seed}})
    )
    evals = [
        {
            "agent_steps": steps,
            "wall_s": 1.0,
            "evaluation": {
                "winblock": {
                    "exhaustive": False,
                    "seats": {
                        "player_0": {"win": first, "draw": 0, "loss": 1 - first},
                        "player_1": {"win": second, "draw": 0, "loss": 1 - second},
                    },
                }
            },
        }
        for steps, first, second in wins
    ]
    (run / "progress.json").write_text(json.dumps({"agent_steps": 0, "evals": evals}))
    return run


def _gym_run(root: Path, seed: int, returns: list[tuple[int, float]]) -> Path:
    run = root / f"gym-s{seed}"
    run.mkdir()
    (run / "config.yaml").write_text(
        yaml.safe_dump({"name": "cartpole_ppo", "training": {"eval_every": 10_000, "seed": seed}})
    )
    (run / "progress.json").write_text(
        json.dumps(
            {"evals": [{"env_steps": s, "mean_return": r, "std_return": 0.0} for s, r in returns]}
        )
    )
    return run


def test_runs_of_a_config_are_summarised_at_each_evaluation_point(tmp_path):
    # evaluations land just past each point (whole jobs); a run still going has fewer
    a = _game_run(tmp_path, "league", 0, [(100_418, 0.3, 0.2), (200_166, 0.6, 0.5)])
    b = _game_run(tmp_path, "league", 1, [(100_040, 0.5, 0.4), (199_990, 0.8, 0.7)])
    c = _game_run(tmp_path, "league", 2, [(100_101, 0.4, 0.3)])
    runs = [load_run(str(r)) for r in (a, b, c)]
    table = summarise(runs)["league"]
    assert list(table) == [100_000, 200_000]
    first = table[100_000]["winblock player_0"]
    assert (first.mean, first.low, first.high, first.n) == pytest.approx((0.4, 0.3, 0.5, 3))
    second = table[200_000]["winblock player_1"]
    assert (second.mean, second.low, second.high, second.n) == pytest.approx((0.6, 0.5, 0.7, 2))
    text = compare([str(a), str(b), str(c)])
    assert "league: 3 runs: league-s0 (seed 0), league-s1 (seed 1), league-s2 (seed 2)" in text
    assert "0.400 [0.300, 0.500] (3)" in text and "0.600 [0.500, 0.700] (2)" in text


def test_labels_group_runs_and_gym_runs_report_their_return(tmp_path):
    sp = _game_run(tmp_path, "selfplay", 0, [(100_000, 0.1, 0.1)])
    league = _game_run(tmp_path, "league", 0, [(100_000, 0.3, 0.2)])
    gym = [_gym_run(tmp_path, s, [(10_000, 100.0 + 50 * s), (20_000, 500.0)]) for s in (0, 1)]
    out = tmp_path / "summary.json"
    text = compare([f"mine={sp}", f"mine={league}", *map(str, gym)], json_out=out)
    summary = json.loads(out.read_text())
    assert summary["mine"]["points"]["100000"]["winblock player_0"]["mean"] == pytest.approx(0.2)
    assert summary["cartpole_ppo"]["points"]["10000"]["mean return"] == {
        "mean": 125.0,
        "low": 100.0,
        "high": 150.0,
        "n": 2,
    }
    assert "125.0 [100.0, 150.0] (2)" in text and "env steps" in text


def test_what_cannot_be_compared_is_refused_naming_it(tmp_path, capsys):
    gym = _gym_run(tmp_path, 0, [(10_000, 1.0)])
    game = _game_run(tmp_path, "league", 0, [(100_000, 0.3, 0.2)])
    with pytest.raises(RunConfigError, match="mixes game and gym runs"):
        compare([f"x={gym}", f"x={game}"])
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 1
    assert "not a run directory with evaluations (config.yaml is missing" in capsys.readouterr().err
