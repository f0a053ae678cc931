"""docker-compose.yml: the services it wires can actually meet (static, always), and where a
Docker daemon runs, `docker compose up --build --abort-on-container-exit --exit-code-from
harness` really works from a fresh copy of the repository (skipped, with the reason, where it
cannot run)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from mistk_rl.service.server import import_implementation
from tests.conftest import REPO

DEFAULT_CONFIG = re.compile(r"^\$\{MISTK_RL_CONFIG:-(?P<path>[^}]+)\}$")


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_compose_services_point_at_real_classes_and_config():
    services = _compose()["services"]
    assert {"agent", "orchestrator", "harness"} <= set(services)
    for name in ("agent", "orchestrator"):
        command = services[name]["command"]
        assert command[:2] == ["serve", name]
        import_implementation(name, command[2])  # the class exists and has the right base
        assert "--host" in command  # inside the compose network it must not bind loopback
    orch_command = services["orchestrator"]["command"]
    allowed = _option(orch_command, "--allow-agent-host")
    config_arg = services["harness"]["command"][1]
    match = DEFAULT_CONFIG.match(config_arg)
    config = load_config(REPO / (match["path"] if match else config_arg))
    assert config.agents[0].url.startswith(f"http://{allowed}:")
    assert services["harness"]["depends_on"]["agent"]["condition"] == "service_healthy"


def test_compose_builds_one_image_requires_the_token_and_keeps_data_on_the_host():
    services = _compose()["services"]
    builders = [name for name, service in services.items() if "build" in service]
    assert builders == ["agent"]  # one build; the others run the image it tags
    images = {service["image"] for service in services.values()}
    assert len(images) == 1
    for name, service in services.items():
        if name not in builders:
            assert service["pull_policy"] == "never", name  # never look for it in a registry
        token = service["environment"]["MISTK_RL_TOKEN"]
        assert token.startswith("${MISTK_RL_TOKEN:?"), name  # no default: compose refuses
        assert "./runs:/runs" in service["volumes"], name
    out = _option(services["harness"]["command"], "--out")
    for name in ("agent", "orchestrator"):
        data_dir = _option(services[name]["command"], "--data-dir")
        assert data_dir == f"{out}/data/{name}"  # under the ./runs mount, like a local run's


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"  # everything else (.git, runs, venvs, tests...) stays out
    allowed = {p[1:] for p in patterns if p.startswith("!")}
    copied = set()
    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied.update(w.rstrip("/") for w in words[1:-1] if not w.startswith("--"))
    assert copied == allowed
    for path in copied:
        assert (REPO / path).exists(), path
    assert os.access(REPO / "docker" / "entrypoint.sh", os.X_OK)


# ---- the real thing, with a Docker daemon ------------------------------------------------


def _docker(
    *args: str, timeout: float, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def _require_docker() -> None:
    """Skip, saying why, unless a daemon, compose v2 and the Dockerfile's base image are here."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on PATH")
    try:
        info = _docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.skip("no Docker daemon: `docker info` timed out")
    if info.returncode != 0:
        pytest.skip(f"no Docker daemon: `docker info` failed: {info.stderr.strip()[-300:]}")
    if _docker("compose", "version", timeout=30).returncode != 0:
        pytest.skip("`docker compose` (compose v2) is not installed")
    base = re.search(r"^FROM\s+(\S+)", (REPO / "Dockerfile").read_text(), re.M)[1]
    if _docker("image", "inspect", base, timeout=30).returncode != 0:
        try:
            pulled = _docker("pull", base, timeout=300)
        except subprocess.TimeoutExpired:
            pytest.skip(f"base image {base} is absent and `docker pull` timed out")
        if pulled.returncode != 0:
            pytest.skip(
                f"base image {base} is absent and cannot be pulled: {pulled.stderr.strip()[-300:]}"
            )


def _fresh_copy(dest: Path) -> None:
    """What a clone of the current work would hold: tracked and new not-ignored files."""
    try:
        listed = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"the repository's files cannot be listed with git: {exc}")
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted in the work tree is not in a fresh clone
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


@pytest.mark.timeout(1200)  # cold: base image pull + dependency install; warm: ~10 s
def test_compose_up_from_a_fresh_copy(tmp_path: Path):
    _require_docker()
    project = tmp_path / "repo"
    _fresh_copy(project)
    assert not (project / "runs").exists()  # as in a fresh clone: docker creates it root-owned
    name = f"mistkrltest{secrets.token_hex(4)}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MISTK_RL_", "COMPOSE_", "DOCKER_DEFAULT_PLATFORM"))
    }
    env["MISTK_RL_IMAGE"] = f"mistk-rl:{name}"  # leaves the user's mistk-rl:latest alone
    owner = 1000  # the image's user, whom the entrypoint hands the root-owned ./runs
    if os.getuid() != 0:  # run as ourselves, so that we can read and delete what it writes
        env["MISTK_RL_UID"], env["MISTK_RL_GID"] = str(os.getuid()), str(os.getgid())
        owner = os.getuid()
    compose = ("compose", "-p", name)
    up = (*compose, "up", "--build", "--abort-on-container-exit", "--exit-code-from", "harness")

    refused = _docker(*up, timeout=120, env=env, cwd=project)  # MISTK_RL_TOKEN not set
    assert refused.returncode != 0
    assert "MISTK_RL_TOKEN" in refused.stderr and "must be set" in refused.stderr, refused.stderr
    started = _docker(
        "ps", "-aq", "--filter", f"label=com.docker.compose.project={name}", timeout=60
    )
    assert started.stdout.strip() == ""

    env["MISTK_RL_TOKEN"] = secrets.token_hex(16)
    try:
        ran = _docker(*up, timeout=1000, env=env, cwd=project)
        log = ran.stdout + ran.stderr
        assert ran.returncode == 0, log[-6000:]
        assert "Pulling" not in log  # the image is built once and never looked up elsewhere
        containers = _docker(
            "ps", "-aq", "--filter", f"label=com.docker.compose.project={name}", timeout=60
        ).stdout.split()
        assert len(containers) == 3
        used = _docker("inspect", "--format", "{{.Image}}", *containers, timeout=60)
        assert len(set(used.stdout.split())) == 1, used.stdout

        run_dir = project / "runs" / "compose"
        results = json.loads((run_dir / "results.json").read_text())
        assert results["episode_count"] == 3
        assert len((run_dir / "episodes.jsonl").read_text().splitlines()) == 3
        model = run_dir / "data" / "agent" / "player.json"  # the config's agent save_path
        episodes = run_dir / "data" / "orchestrator" / "episodes.json"  # its episode save_path
        assert model.stat().st_size > 0 and json.loads(episodes.read_text())
        for path in (project / "runs", run_dir / "results.json", model, episodes):
            assert path.stat().st_uid == owner, path  # written by the unprivileged user
    finally:
        _docker(
            *compose,
            "down",
            "-v",
            "--rmi",
            "all",
            "--remove-orphans",
            timeout=300,
            env=env,
            cwd=project,
        )


def test_league_compose_wires_players_pool_workers_and_one_shared_directory():
    compose = yaml.safe_load((REPO / "docker-compose.league.yml").read_text())
    services = compose["services"]
    config = load_config(REPO / DEFAULT_CONFIG.match(services["harness"]["command"][1])["path"])
    league = config.orchestrator.env.league
    agents = {a.name: a for a in config.agents}
    shares = set()
    for name, service in services.items():
        if name == "harness":
            continue
        command = service["command"]
        role = command[1]
        import_implementation(role, command[2])
        assert _option(command, "--host") == "0.0.0.0"
        port = _option(command, "--port")
        if role == "agent":
            assert agents[name].url == f"http://{name}:{port}"
        if "--share" in command:
            shares.add(_option(command, "--share"))
    workers = [
        n
        for n, s in services.items()
        if s.get("command", [None] * 3)[2] == "orchestrators.game_orchestrator:GameOrchestrator"
    ]
    assert sorted(league["workers"]) == sorted(f"http://{w}:8080" for w in workers)
    assert len(workers) == 2
    assert config.orchestrator.url == "http://league:8080"
    assert len(shares) == 1  # one league directory, seen alike by the league and every agent
    sharing = {n for n, s in services.items() if "--share" in s.get("command", [])}
    assert sharing == set(agents) | {"league"}
    hosts = set(services["main"]["environment"]["MISTK_RL_AGENT_HOSTS"].split(","))
    assert hosts == set(agents)
    assert set(services["harness"]["depends_on"]) == set(services) - {"harness"}
    assert [n for n, s in services.items() if "build" in s] == ["main"]
