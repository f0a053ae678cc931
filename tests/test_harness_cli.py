"""`mistk-rl run` as a user runs it: a subprocess, real services, results on disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SIGINT_IGNORED, group_alive


def _run(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "harness", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _service_pids(run_dir: Path) -> list[int]:
    """gunicorn master pids of the run, read back from its logs."""
    pids = []
    for log in (run_dir / "logs").glob("*.log"):
        for line in log.read_text().splitlines():
            if "Listening at" in line or "Starting gunicorn" in line:
                pids.extend(
                    int(tok.strip("[]"))
                    for tok in line.split()
                    if tok.startswith("[") and tok.strip("[]").isdigit()
                )
    return pids


def test_run_example_config_writes_results(tmp_path):
    out = tmp_path / "run"
    proc = _run([str(REPO / "configs" / "cartpole_random.yaml"), "--out", str(out)], REPO)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert results["episode_count"] == len(episodes) == 3 and results["wall_s"] > 0
    assert results["episode_mean_return"] == pytest.approx(
        sum(e["return"] for e in episodes) / 3, abs=1e-6
    )
    assert "episodes" not in results  # (the summary only: each episode is a line beside it)
    for episode in episodes:
        assert {"agent", "return", "length"} <= set(episode)
        assert f"return {episode['return']:9.2f}" in proc.stdout
    assert (out / "data" / "player" / "player.json").exists()  # saveModel
    assert (out / "data" / "orchestrator" / "episodes.json").exists()  # saveEpisode
    pids = _service_pids(out)
    assert pids and not any(group_alive(pid) for pid in pids)


def test_run_fails_clearly_and_cleans_up(tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text(
        (REPO / "configs" / "cartpole_random.yaml")
        .read_text()
        .replace("id: CartPole-v1", "id: NoSuchEnv-v0")
    )
    out = tmp_path / "run"
    proc = _run([str(config), "--out", str(out)], REPO)
    assert proc.returncode == 1
    assert "orchestrator initialize failed" in proc.stderr and "NoSuchEnv-v0" in proc.stderr
    assert not (out / "results.json").exists()
    pids = _service_pids(out)
    assert pids and not any(group_alive(pid) for pid in pids)


def test_run_reports_a_bad_target(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text(
        (REPO / "configs" / "cartpole_random.yaml")
        .read_text()
        .replace("RandomAgent", "RandomAgnet")
    )
    proc = _run([str(config), "--out", str(tmp_path / "run")], REPO)
    assert proc.returncode == 1
    assert "RandomAgnet" in proc.stderr


def test_serve_on_a_taken_port_says_so_at_once(tmp_path):
    """(gunicorn alone retried for 5 s, printing Errno 98.)"""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mistk_rl",
                "serve",
                "agent",
                "agents.random_agent:RandomAgent",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"mistk-rl serve: port {port} on 127.0.0.1 is in use "
        "(another service?): choose another with --port, or "
        "--port 0 for a free one"
    )


def test_version():
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    from mistk_rl import __version__

    assert proc.returncode == 0 and proc.stdout.startswith(f"mistk-rl {__version__} (HTTP API")


@SIGINT_IGNORED
def test_ctrl_c_stops_the_services_and_says_where_the_run_is(tmp_path):
    """SIGINT (Ctrl-C) after the first checkpoint: exit 130, every service stopped, and a
    line saying so, with how to resume."""
    import signal

    import yaml

    from harness.bench.faults import HarnessProcess

    config = yaml.safe_load((REPO / "configs" / "cartpole_dqn.yaml").read_text())
    # no stop_value: a lucky one-episode evaluation must not end the run before the signal
    config["training"].update(env_steps=10**6, eval_every=500, eval_episodes=1, stop_value=None)
    run = HarnessProcess(config, tmp_path / "run", REPO)
    run.wait_for_line("eval at", timeout=120)  # (progress.json is written with it)
    run.process.send_signal(signal.SIGINT)
    try:
        code, stderr = run.finish()
    finally:  # (when it did not stop: SIGTERM, which stops its services too)
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGTERM)
            run.process.wait(60)
    assert code == 130, stderr
    assert stderr.strip().endswith(
        f"mistk-rl run: interrupted (Ctrl-C); the services it started are stopped; what it "
        f"did so far is in {tmp_path / 'run'} (continue with 'mistk-rl run --resume "
        f"{tmp_path / 'run'}')"
    ), stderr
    pids = _service_pids(tmp_path / "run")
    assert pids and not any(group_alive(pid) for pid in pids)


def test_serve_starts_without_warnings_and_says_where(tmp_path):
    """`--port 0` takes a free port and prints the base URL first; the log holds no
    warning (connexion's import used to open every log with one) and no gunicorn control
    socket (one path per user, which every service on the machine took over)."""
    import re
    import signal

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mistk_rl",
            "serve",
            "agent",
            "agents.random_agent:RandomAgent",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines = []
    try:
        for line in process.stdout:  # (ends when the service does: it is stopped below)
            lines.append(line)
            if "Application startup complete" in line:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    first = re.fullmatch(
        r"mistk-rl serve: agent agents\.random_agent:RandomAgent on "
        r"http://127\.0\.0\.1:(\d+)/v1/mistk/agent\n",
        lines[0],
    )
    assert first and int(first.group(1)) > 0, lines[0]
    assert any("Application startup complete" in line for line in lines), lines
    assert not [line for line in lines if "Warning" in line or "Control socket" in line]


@pytest.mark.long(20)
def test_eval_of_a_single_agent_run_uses_its_last_checkpoint(tmp_path):
    """`mistk-rl eval CONFIG --run RUN_DIR` on a gym config: the agent loads the checkpoint
    of the run's last evaluation and plays greedy episodes on the fixed evaluation seeds
    (twice: the same returns), written to evaluation.json and printed."""
    import yaml

    config = yaml.safe_load((REPO / "configs" / "cartpole_dqn.yaml").read_text())
    config["training"].update(env_steps=500, eval_every=500, eval_episodes=2)
    del config["agents"][0]["save_path"]
    path = tmp_path / "dqn.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert _run([str(path), "--out", str(run_dir), "--quiet"], REPO).returncode == 0
    outputs = []
    for _ in range(2):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "eval",
                str(path),
                "--run",
                str(run_dir),
                "--episodes",
                "4",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr
        kept = json.loads((run_dir / "progress.json").read_text())["checkpoints"]["player"]
        assert f"agent player: the model in {kept}\n" in proc.stdout
        outputs.append(json.loads((run_dir / "evaluation.json").read_text())["evaluation"])
    first, second = outputs
    assert len(first["returns"]) == 4 and first == second
    line = [x for x in proc.stdout.splitlines() if x.startswith("evaluation: ")][0]
    assert line.startswith(
        f"evaluation: mean return {first['mean_return']:.2f}, std "
        f"{first['std_return']:.2f} over 4 greedy episodes (seeds from "
        f"10000): "
    )


def test_dashboard_without_a_run_dir_says_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "dashboard", str(tmp_path / "nowhere")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no run directory" in proc.stderr and "nowhere" in proc.stderr
