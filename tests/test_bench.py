"""The step-path benchmarks run end to end and write comparable records (tiny sizes here:
the figures themselves are measured with `mistk-rl bench`, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mistk_rl.wire.spin import DEFAULT_SPIN
from tests.conftest import REPO


@pytest.mark.long(18)
def test_bench_transport_and_envs_write_records(tmp_path):
    for what in ("transport", "envs"):
        out = tmp_path / f"{what}.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "bench",
                what,
                "--envs",
                "2",
                "--steps",
                "60",
                "--json",
                str(out),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr
        records = json.loads(out.read_text())["records"]
        modes = {r["mode"] for r in records}
        expected = (
            {
                "inprocess",
                "http",
                "http-binary",
                "http-binary-varied",
                "http-pipelined",
                "stream",
                "stream-varied",
                "stream-pipelined",
                "http-entity",
                "dqn-inprocess",
                "dqn-http",
                "dqn-local",
            }
            if what == "transport"
            else {"base", "subprocess", "async", "gym_sync", "gym_async"}
        )
        assert modes == expected
        for record in records:
            assert record["bench"] == what and record["envs"] == 2
            assert record["steps_per_s"] > 0
            if record["mode"].startswith(("http", "stream")):  # the bytes on the wire
                assert record["wire_bytes_per_step"] > record["raw_bytes_per_step"] > 0
            if what == "transport" and record["mode"] not in ("inprocess", "dqn-inprocess"):
                assert record["rounds"] == 5
                assert (
                    0 < record["to_base_min"] <= record["to_base_median"] <= record["to_base_max"]
                )


def test_interleaved_modes_take_turns_and_ratios_are_taken_round_by_round():
    from harness.bench.step import Block, interleaved, summarize

    order = []
    speeds = iter([100.0, 50.0, 200.0, 60.0, 100.0, 40.0])  # the machine drifts, round by round

    def measure(mode: str) -> Block:
        order.append(mode)
        return Block(1000, 1000 / next(speeds), wire=0 if mode == "inprocess" else 25_000)

    blocks = interleaved(["inprocess", "http"], 3, measure)
    assert order == ["inprocess", "http"] * 3
    base, served = summarize(blocks, "inprocess", envs=4)
    assert base["steps_per_s"] == pytest.approx(3000 / (10 + 5 + 10), abs=0.1)
    assert "to_base_median" not in base and "wire_bytes_per_step" not in base
    # 0.5, 0.3, 0.4 round by round: their median, not a ratio of the pooled rates (0.35)
    assert (served["to_base_min"], served["to_base_median"], served["to_base_max"]) == (
        0.3,
        0.4,
        0.5,
    )
    assert served["wire_bytes_per_step"] == 25.0 and served["rounds"] == 3


def test_parity_outcome_and_comparison():
    from harness.bench.parity import compare, meets_targets, outcome

    evals = [
        {"env_steps": 2500, "wall_s": 2.0, "mean_return": 200.0},
        {"env_steps": 5000, "wall_s": 4.5, "mean_return": 480.0},
        {"env_steps": 7500, "wall_s": 7.0, "mean_return": 500.0},
    ]
    assert outcome(evals, 475) == {
        "env_steps": 5000,
        "wall_s": 4.5,
        "final_mean": 500.0,
        "evals": 3,
    }
    never = outcome(evals[:1], 475)
    assert never["env_steps"] is None and never["wall_s"] is None
    records = [
        {"ours": outcome(evals, 475), "sb3": outcome(evals[2:], 475)},  # 4.5 vs 7.0
        {"ours": outcome(evals[2:], 475), "sb3": outcome(evals, 475)},  # 7.0 vs 4.5
        {"ours": never, "sb3": outcome(evals, 475)},
    ]  # left out of the means
    summary = compare(records)
    assert summary["both_reached"] == 2 and summary["ours_reached"] == 2
    assert summary["ratio_of_means"] == 1.0 and summary["max_seed_ratio"] == round(7 / 4.5, 2)
    assert summary["steps_ratio"] == 1.0
    assert meets_targets(summary, thresholded=True) is False  # 2 of 3 seeds against 3
    assert meets_targets({**summary, "ours_reached": 3}, thresholded=True) is True
    # no threshold (Pendulum): final means, within 10% of SB3's
    assert meets_targets({"ours_final_mean": -220.0, "sb3_final_mean": -200.0}, False) is True
    assert meets_targets({"ours_final_mean": -230.0, "sb3_final_mean": -200.0}, False) is False


def test_parity_spread_counts_unreached_seeds_at_the_budget():
    from harness.bench.parity import meets_targets, resummarize, spread

    sp = spread([10_000, 20_000, None], [10_000, 10_000, 10_000], budget=50_000)
    assert sp["ours_mean"] == 26_667 and sp["sb3_mean"] == 10_000
    assert sp["ours_range"] == [10_000, 50_000] and sp["ratio"] == 2.67
    assert sp["slowest_ratio"] == 5.0
    low, high = sp["ratio_interval"]
    assert 1.0 <= low < sp["ratio"] < high <= 5.0  # SB3's side never varies: ours does
    assert spread([5, 5], [5, 5], 10)["ratio_interval"] == [1.0, 1.0]

    def record(seed: int, system: str, steps, batch: str = "a") -> dict:
        return {
            "entry": "e",
            "algo": "dqn",
            "env": "CartPole-v1",
            "seed": seed,
            "system": system,
            "env_steps_to_threshold": steps,
            "wall_s_to_threshold": steps and steps / 1000,
            "final_eval": 500.0,
            "budget": 50_000,
            "threshold": 475.0,
            "status": "ok",
            "evals": [{"env_steps": steps or 50_000, "wall_s": 1.0, "mean_return": 500.0}],
        }

    # two seed batches run apart, summarized together: one seed of ours 4x SB3's slowest
    records = [
        record(0, "ours", 10_000),
        record(0, "sb3", 10_000),
        record(1, "ours", 40_000),
        record(1, "sb3", 5_000),
    ]
    (summary,) = resummarize(records)
    assert summary["seeds"] == 2 and summary["steps_ratio"] == round(25_000 / 7_500, 2)
    assert summary["spread"]["slowest_ratio"] == 4.0
    assert meets_targets(summary, thresholded=True) is False
    (fine,) = resummarize(records[:2])
    assert meets_targets(fine, thresholded=True) is True


def test_suite_configs_load_and_map_to_sb3():
    """Every config under configs/suite/ is a valid harness config in exactly one suite, and
    maps to SB3 kwargs with no key left over (and, with SB3 installed, none SB3 lacks)."""
    import inspect

    from harness.bench.parity import SUITE_DIR, SUITES
    from harness.bench.sb3 import sb3_setup
    from harness.config import load_config

    files = sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))
    listed = sorted(name for names in SUITES.values() for name in names)
    assert files == listed
    try:
        from stable_baselines3 import DQN, PPO

        params = {
            "dqn": set(inspect.signature(DQN.__init__).parameters),
            "ppo": set(inspect.signature(PPO.__init__).parameters),
        }
    except ImportError:
        params = None
    for name in files:
        config = load_config(SUITE_DIR / f"{name}.yaml")
        assert config.training is not None and config.training.checkpoints == 0, name
        setup = sb3_setup(config)
        assert setup.algo == name.split("_")[0] and setup.budget == config.training.env_steps
        if params is not None:
            assert set(setup.kwargs) <= params[setup.algo], name


def test_an_sb3_run_leaves_no_folder_behind(monkeypatch, tmp_path):
    pytest.importorskip("stable_baselines3")
    import tempfile

    from harness.bench.parity import entry_path
    from harness.bench.sb3 import run_sb3
    from harness.config import load_config

    data = load_config(entry_path("ppo_cartpole")).model_dump()
    data["training"].update(env_steps=64, eval_every=64, eval_episodes=1)
    data["agents"][0]["hyperparameters"]["train"]["n_steps"] = 32
    data["agents"][0]["hyperparameters"]["policy"]["learn"]["batch_size"] = 32
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config = type(load_config(entry_path("ppo_cartpole"))).model_validate(data)
    result = run_sb3(config, seed=0)
    assert result["evals"] and not list(tmp_path.glob("SB3-*"))


def test_sb3_mapping_refuses_what_sb3_cannot_express():
    from harness.bench.parity import entry_path
    from harness.bench.sb3 import Unmappable, sb3_setup
    from harness.config import load_config

    config = load_config(entry_path("dqn_cartpole"))
    data = config.model_dump()
    data["agents"][0]["hyperparameters"]["policy"]["learn"]["double"] = True
    with pytest.raises(Unmappable, match="policy.learn.double"):
        sb3_setup(type(config).model_validate(data))
    kwargs = sb3_setup(config).kwargs  # ours counts target syncs in updates, SB3 in steps
    assert kwargs["target_update_interval"] == 256 and kwargs["exploration_fraction"] == 0.16


def test_learning_aliases_run_the_cartpole_entry(monkeypatch):
    import harness.bench as bench

    calls = []
    monkeypatch.setattr(bench, "bench_parity", lambda *args: calls.append(args) or 0)
    assert bench.run_bench("learning-dqn", seeds=[4]) == 0
    assert calls == [("classic", [4], ["dqn_cartpole"], None, None, False)]


def test_bench_parity_runs_both_sides(tmp_path):
    pytest.importorskip("stable_baselines3")
    import yaml

    config = yaml.safe_load((REPO / "configs" / "suite" / "ppo_cartpole.yaml").read_text())
    config["training"].update(env_steps=512, eval_every=512, eval_episodes=2, stop_value=1)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "parity.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "bench",
            "parity",
            "--seeds",
            "3",
            "--config",
            str(path),
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    records = {r["system"]: r for r in result["records"]}
    assert set(records) == {"ours", "sb3"}
    for record in records.values():  # a stop value of 1 is reached at the first evaluation
        assert record["status"] == "ok" and record["seed"] == 3 and record["budget"] == 512
        assert record["env_steps_to_threshold"] == 512 and len(record["evals"]) == 1
        assert record["algo"] == "ppo" and record["env"] == "CartPole-v1"
    (summary,) = result["summaries"]
    assert summary["both_reached"] == 1 and summary["meets_targets"] is not None
    assert summary["spread"]["ratio"] == 1.0  # (both reached it at the first evaluation)
    assert "tiny" in proc.stdout  # the summary table names the entry
    again = subprocess.run(
        [sys.executable, "-m", "harness", "bench", "parity", "--from", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and again.stdout.strip() == proc.stdout.split("\n\n")[-1].strip()


@pytest.fixture(autouse=True)
def _tagged(monkeypatch):
    """Each test's processes carry a tag of its own in their environment (inherited by the
    benches it starts and their servers), so `_floor_servers` counts this test's only, not
    those of a test running beside it."""
    monkeypatch.setenv(_TAG, f"{os.getpid()}-{os.urandom(4).hex()}")


_TAG = "MISTK_RL_TEST_TAG"


def _floor_servers() -> list[str]:
    """Command lines of live processes serving `harness.bench.floor` (only its bench starts
    them) started by this test."""
    tag = f"{_TAG}={os.environ[_TAG]}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "harness.bench.floor" in cmdline and state != "Z" and tag in environ:
            found.append(cmdline)
    return found


@pytest.mark.parametrize("spin", [[], ["--spin", "150"]])
def test_bench_getaction_reports_the_machines_floor_beside_it(tmp_path, spin):
    out = tmp_path / "getaction.json"
    env = {k: v for k, v in os.environ.items() if k != "MISTK_RL_SPIN_US"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "bench",
            "getaction",
            "--n",
            "50",
            "--json",
            str(out),
            *spin,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())["records"]
    assert [(r["bench"], r.get("kind")) for r in records] == [
        ("getaction", None),
        ("floor", "echo"),
        ("floor", "asgi"),
    ]
    for record in records:
        assert record["calls"] == 50 and record["cpus_awake"] is False
        default = DEFAULT_SPIN * 1e6 if len(os.sched_getaffinity(0)) >= 2 else 0  # (unset)
        assert record["spin_us"] == (150 if spin else default)
        assert 0 < record["p10_ms"] <= record["median_ms"] <= record["p90_ms"]
    assert "kind=asgi" in proc.stdout
    assert _floor_servers() == []


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_cpus_kept_awake_spins_one_idle_class_process_per_cpu_and_ends_them():
    from harness.bench.floor import cpus_kept_awake

    cpus = sorted(os.sched_getaffinity(0))
    with pytest.raises(KeyError):  # however the block ends, its spinners end with it
        with cpus_kept_awake() as spinners:
            assert [sorted(os.sched_getaffinity(s.pid)) for s in spinners] == [[c] for c in cpus]
            assert all(os.sched_getscheduler(s.pid) == os.SCHED_IDLE for s in spinners)
            assert all(s.poll() is None for s in spinners)
            raise KeyError("the bench failed")
    assert all(s.returncode is not None for s in spinners)
    assert _floor_servers() == []


@pytest.mark.parametrize("flag", [["--awake"], ["--spin", "200"]])
def test_awake_and_spin_are_refused_where_they_mean_nothing(flag):
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "bench", "envs", *flag],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and f"{flag[0]} is for getaction and transport" in proc.stderr


def test_a_bad_spin_in_the_environment_stops_the_cli_before_anything_runs():
    env = {**os.environ, "MISTK_RL_SPIN_US": "fast"}
    for command in (
        ["harness", "bench", "getaction", "--n", "5"],
        ["mistk_rl", "serve", "agent", "agents.random_agent:RandomAgent", "--port", "0"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", *command],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert "MISTK_RL_SPIN_US='fast'" in proc.stderr


def test_floor_servers_answer_as_the_services_would_and_are_stopped():
    """The asgi floor's caller checks every answer (status and body), so a floor server
    that answered anything else would fail here instead of timing an error."""
    from harness.bench.floor import measure_floor

    records = measure_floor(calls=20, warmup=2)
    assert [r["kind"] for r in records] == ["echo", "asgi"]
    assert all(r["median_ms"] > 0 for r in records)
    assert _floor_servers() == []


def test_a_floor_server_answering_otherwise_fails_the_bench_naming_it(monkeypatch):
    from harness.bench import floor

    monkeypatch.setattr(floor, "ANSWER_BODY", b'{"actions":{"player":1}}')  # the child sends 0
    with pytest.raises(RuntimeError, match="asgi floor server did not answer as it should"):
        floor._measure("asgi", calls=5, warmup=1)
    assert _floor_servers() == []


def test_one_copy_ceiling_is_the_in_process_step_over_it_plus_the_round_trip():
    from harness.bench import _one_copy_ceiling

    floor = [
        {"bench": "floor", "kind": "echo", "median_ms": 0.05},
        {"bench": "floor", "kind": "asgi", "median_ms": 0.3},
    ]
    records = [
        {"bench": "transport", "mode": "inprocess", "envs": 16, "steps_per_s": 1e5},
        {"bench": "transport", "mode": "inprocess", "envs": 1, "steps_per_s": 1e4},
    ]
    added = _one_copy_ceiling(records, floor)
    assert added[:2] == floor
    assert added[2]["served_to_inprocess_max"] == pytest.approx(0.1 / (0.1 + 0.3))


def test_seeds_take_lists_and_ranges_and_refuse_the_rest():
    import argparse

    from harness.cli import seed_list

    assert seed_list("0..9") == list(range(10))  # the issue's own spelling: both ends
    assert seed_list("3") == [3] and seed_list("0..2,7") == [0, 1, 2, 7]
    for bad in ("a", "5..2", "1..x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)


def test_every_benchmark_the_command_offers_has_a_runner():
    """`mistk-rl bench`'s choices (harness.cli.BENCHES) and run_bench's table name the same
    benchmarks: none offered that cannot run, none runnable that is not offered."""
    from harness.bench import BENCH_RUNNERS
    from harness.cli import BENCHES, build_parser

    assert set(BENCHES) == set(BENCH_RUNNERS)
    args = build_parser().parse_args(["bench", "transport", "--envs", "1,64", "--spin", "0"])
    assert (args.what, args.envs, args.spin, args.steps) == ("transport", "1,64", 0.0, 20000)


def test_bench_versus_runs_two_checkouts_side_by_side(tmp_path):
    """`bench versus --baseline DIR`: a service from each tree, timed in turns; the records
    give both sides' rates and CPU per step and the ratio with its interval."""
    import shutil

    baseline = tmp_path / "baseline"
    for package in ("mistk_rl", "agents", "orchestrators"):
        shutil.copytree(
            REPO / package, baseline / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path / "versus.json"
    command = [sys.executable, "-m", "harness", "bench", "versus", "--envs", "1", "--n", "1"]
    proc = subprocess.run(
        [*command, "--baseline", str(baseline), "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    assert [(r["mode"], r["envs"], r["rounds"]) for r in records] == [
        ("http", 1, 1),
        ("stream", 1, 1),
    ]
    for r in records:
        assert r["this_steps_per_s"] > 0 and r["baseline_steps_per_s"] > 0
        assert r["this_cpu_us_per_step"] > 0 and r["baseline_cpu_us_per_step"] > 0
        assert r["ratio_interval"][0] <= r["ratio"] <= r["ratio_interval"][1]
    assert "this / baseline" in proc.stdout
    refused = subprocess.run(
        [*command, "--baseline", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "is not a checkout" in refused.stderr
