"""Services on a Ray cluster (`mistk_rl.deploy.cluster`, `mistk-rl run --cluster`).

The cases in `tests/cluster/` start a real three-node cluster on this machine; they run in a
loopback-only network namespace (``unshare --net``: Ray binds the machine's interface address
otherwise), in a pytest of their own, started here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.config import RunConfig, RunConfigError, load_config, with_cluster
from mistk_rl.deploy.cluster import Resources
from tests.netns import pytest_in_namespace

REPO = Path(__file__).resolve().parent.parent
CASES = sorted((REPO / "tests" / "cluster").glob("cases_*.py"))
# Each case's own bound inside the run (pytest-timeout there): a hang fails the case that
# hangs. The run as a whole gets the sum, so a busy machine slows it without failing it
# (a 540 s bound on all twelve, which take ~220 s alone, was once passed under load).
CASE_BUDGET_S = 240
RUN_BUDGET_S = CASE_BUDGET_S * sum(
    len(re.findall(r"^def test_", case.read_text(), re.M)) for case in CASES
)
RAY_PROCESSES = (
    "raylet",
    "gcs_server",
    "ray::",
    "mistk-rl-agent",
    "mistk-rl-orchestrator",
    "default_worker.py",
)


def _ray_processes() -> set[int]:
    """Ray's and the services' processes outside this process's network namespace: those the
    cases start live in the one `unshare` made (services that tests running beside these, in
    other pytest workers, start here are not theirs)."""
    ours = os.readlink("/proc/self/ns/net")
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            netns = os.readlink(cmdline.parent / "ns" / "net")
        except OSError:
            continue
        if netns != ours and any(name in text for name in RAY_PROCESSES):
            found.add(int(cmdline.parent.name))
    return found


@pytest.mark.long(270)
@pytest.mark.timeout(RUN_BUDGET_S + 60)  # (the run's own bound comes first)
def test_the_cluster_cases_pass_in_a_loopback_only_network():
    """tests/cluster/cases_*.py inside ``unshare --net --map-root-user`` (lo up), and no Ray
    or service process is left afterwards. Ray keeps its files in a directory of this test
    (RAY_TMPDIR), so the ray_current_cluster file its clusters write never names, for the
    rest of the machine, a cluster that is gone. (A short path: Ray's sockets live there.)"""
    before = _ray_processes()
    ray_tmp = tempfile.mkdtemp(prefix="mistk-ray-")
    try:
        done = pytest_in_namespace(
            f"-o python_files=cases_*.py -o timeout={CASE_BUDGET_S} tests/cluster/",
            RUN_BUDGET_S,
            env={"RAY_TMPDIR": ray_tmp},
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-2000:]
    assert _ray_processes() - before == set()


def test_a_cluster_block_and_service_resources_are_read():
    config = RunConfig.model_validate(
        {
            "orchestrator": {
                "target": "orchestrators.gym_orchestrator:GymOrchestrator",
                "env": {"id": "CartPole-v1"},
            },
            "agents": [
                {
                    "name": "a",
                    "target": "agents.random_agent:RandomAgent",
                    "gpus": 1,
                    "resources": {"trainer_node": 0.5},
                }
            ],
            "cluster": {"data_root": "/srv/mistk"},
        }
    )
    assert config.cluster.address == "auto"
    assert with_cluster(config, "10.0.0.5:6379").cluster.model_dump() == {
        "address": "10.0.0.5:6379",
        "data_root": "/srv/mistk",
    }
    agent = config.agents[0]
    resources = Resources(agent.cpus, agent.gpus, agent.resources)
    assert resources.options() == {
        "num_cpus": 1.0,
        "num_gpus": 1,
        "resources": {"trainer_node": 0.5},
    }
    assert str(resources) == "1 CPU, 1 GPU, 0.5 trainer_node"
    with pytest.raises(ValueError, match="cpus"):
        RunConfig.model_validate(
            {**config.model_dump(), "agents": [{"name": "a", "target": "x:Y", "cpus": -1}]}
        )


def test_a_worker_pool_stands_for_that_many_workers(tmp_path):
    """``workers: {count: N, ...}``: N game orchestrators (a solo league's: gym ones)."""
    import yaml

    data = yaml.safe_load((REPO / "configs" / "tictactoe_league.yaml").read_text())
    data["workers"] = {"count": 3, "cpus": 0.5, "resources": {"games": 1}}
    workers = RunConfig.model_validate(data).workers
    assert [(w.target, w.cpus, w.resources) for w in workers] == [
        ("orchestrators.game_orchestrator:GameOrchestrator", 0.5, {"games": 1})
    ] * 3
    solo = yaml.safe_load((REPO / "configs" / "cartpole_solo_league.yaml").read_text())
    solo["workers"] = {"count": 2}
    assert {w.target for w in RunConfig.model_validate(solo).workers} == {
        "orchestrators.gym_orchestrator:GymOrchestrator"
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**data, "workers": {"count": 0}}))
    with pytest.raises(RunConfigError, match="workers: count"):
        load_config(bad)


def test_a_run_without_a_cluster_does_not_import_ray(tmp_path):
    """Ray is an extra: one machine never loads it (it takes seconds and a lot of memory)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from harness.run import run_from_file; "
            f"code = run_from_file(Path('configs/cartpole_random.yaml'), "
            f"out=Path({str(tmp_path / 'run')!r}), quiet=True); "
            "print(code, 'ray' in sys.modules)",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split() == ["0", "False"], done.stderr[-2000:]


@pytest.mark.parametrize("address", ["127.0.0.1:9", "auto"])
def test_no_cluster_at_the_address_is_a_clear_error(tmp_path, address):
    """``--cluster`` naming no running cluster: exit 1 with a message saying how to start
    one, before any service starts. ``auto`` here names the cluster in Ray's
    ray_current_cluster file, one that is gone (ray.init would retry it for minutes)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "configs/cartpole_random.yaml",
            "--cluster",
            address,
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": "", "RAY_TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"no Ray cluster at '{address}'" in done.stderr and "ray start --head" in done.stderr
    if address == "auto":  # the file's address; or, while tests/cluster/ runs beside this
        # test (its own network namespace), that cluster's: Ray's auto prefers a running
        # gcs_server, on any namespace, to the file
        assert ", Ray's last cluster here" in done.stderr
    assert not (tmp_path / "run" / "results.json").exists()
