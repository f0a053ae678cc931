"""The step-path benchmarks run end to end and write comparable records (tiny sizes here:
the figures themselves are measured with `mistk-rl bench`, never asserted)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_bench_transport_and_envs_write_records(tmp_path):
    for what in ("transport", "envs"):
        out = tmp_path / f"{what}.json"
        proc = subprocess.run([sys.executable, "-m", "mistk_rl", "bench", what, "--envs", "2",
                               "--steps", "60", "--json", str(out)], cwd=REPO,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr
        records = json.loads(out.read_text())["records"]
        modes = {r["mode"] for r in records}
        expected = ({"inprocess", "http", "http-binary"} if what == "transport" else
                    {"base", "subprocess", "async", "gym_sync", "gym_async"})
        assert modes == expected
        for record in records:
            assert record["bench"] == what and record["envs"] == 2
            assert record["steps_per_s"] > 0


def test_learning_outcome_and_comparison():
    from mistk_rl.bench_learning import compare, outcome

    evals = [{"env_steps": 2500, "wall_s": 2.0, "mean_return": 200.0},
             {"env_steps": 5000, "wall_s": 4.5, "mean_return": 480.0},
             {"env_steps": 7500, "wall_s": 7.0, "mean_return": 500.0}]
    assert outcome(evals, 475) == {"env_steps": 5000, "wall_s": 4.5, "final_mean": 500.0,
                                   "evals": 3}
    never = outcome(evals[:1], 475)
    assert never["env_steps"] is None and never["wall_s"] is None
    records = [{"ours": outcome(evals, 475), "sb3": outcome(evals[2:], 475)},  # 4.5 vs 7.0
               {"ours": outcome(evals[2:], 475), "sb3": outcome(evals, 475)},  # 7.0 vs 4.5
               {"ours": never, "sb3": outcome(evals, 475)}]  # left out of the means
    summary = compare(records)
    assert summary["both_reached"] == 2 and summary["ours_reached"] == 2
    assert summary["ratio_of_means"] == 1.0 and summary["max_seed_ratio"] == round(7 / 4.5, 2)


def test_bench_learning_runs_both_sides(tmp_path):
    pytest.importorskip("stable_baselines3")
    config = tmp_path / "tiny.yaml"
    config.write_text((REPO / "configs" / "cartpole_ppo.yaml").read_text()
                      .replace("env_steps: 100000", "env_steps: 512")
                      .replace("eval_every: 5000", "eval_every: 512")
                      .replace("eval_episodes: 10", "eval_episodes: 2")
                      .replace("stop_value: 475", "stop_value: 1"))
    out = tmp_path / "learning.json"
    proc = subprocess.run([sys.executable, "-m", "mistk_rl", "bench", "learning-ppo", "--seeds",
                           "3", "--config", str(config), "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    record, summary = json.loads(out.read_text())["records"]
    assert record["seed"] == 3
    for side in ("ours", "sb3"):  # a stop value of 1 is reached at the first evaluation
        assert record[side]["env_steps"] == 512 and record[side]["evals"] == 1
    assert summary["summary"]["both_reached"] == 1
