"""Install anywhere: the built wheel, installed (not editable) into a fresh venv, holds every
package and the OpenAPI contracts, and runs the README's main job. An editable install (the
rest of the suite) hides a package left out of the wheel: setup.cfg's hand-written list once
left out mistk_rl.thinker, and only the Docker image noticed."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOPS = ("mistk_rl", "agents", "orchestrators", "harness")

# Run inside the venv: every module of every package imports, from the venv (not from a
# source tree or the editable install), and the contracts are there as package data.
IMPORT_ALL = r"""
import importlib, importlib.resources, json, pkgutil, sys
site = sys.argv[1]
modules = []
for top in %r:
    package = importlib.import_module(top)
    modules.append(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        modules.append(info.name)
outside = []
for name in modules:
    module = importlib.import_module(name)
    if not (module.__file__ or "").startswith(site):
        outside.append((name, module.__file__))
specs = sorted(p.name for p in importlib.resources.files("mistk_rl.openapi").iterdir()
               if p.name.endswith(".yaml"))
typed = importlib.resources.files("mistk_rl").joinpath("py.typed").is_file()
page = sorted(p.name for p in
              importlib.resources.files("harness.dashboard").joinpath("static").iterdir())
print(json.dumps({"modules": modules, "outside": outside, "specs": specs, "typed": typed,
                  "dashboard": page}))
""" % (TOPS,)


def _run(
    cmd: list[str], cwd: Path, timeout: float, env: dict | None = None
) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _dependency_dirs() -> list[str]:
    """The site-packages this pytest imports its dependencies from: a user's venv, CI's, or
    the system interpreter's. A venv made with ``system_site_packages`` would see only the
    base interpreter's, which in a user's venv holds none of them."""
    dirs = [
        *site.getsitepackages(),
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    ]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(d for d in dirs if Path(d).is_dir()))


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(the venv's python, its site-packages) with the project's wheel installed. The wheel
    is built from the tracked files alone (a copy made with git), so an untracked file in a
    checkout cannot make it pass. The venv sees the running interpreter's packages for the
    dependencies, through a ``.pth`` file listing their directories (pip resolves
    install_requires against them, downloading nothing), after its own site-packages, so its
    copy of the project comes first. A path line in a ``.pth`` adds the directory only: the
    ``.pth`` files inside it, such as an editable install's, are not run."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to copy the tracked files from")
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    files = _run(["git", "ls-files", "-z"], REPO, 60).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = root / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(source),
        ],
        root,
        300,
    )
    (wheel,) = dist.glob("mistk_rl-*.whl")
    env_dir = root / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    site_dir = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            root,
            60,
        ).stdout.strip()
    )
    (site_dir / "zz_dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-index",
            str(wheel),
        ],
        root,
        300,
    )
    return python, site_dir


def test_wheel_imports_every_module_from_the_install(wheel_venv, tmp_path):
    python, site = wheel_venv
    done = _run([str(python), "-c", IMPORT_ALL, str(site)], tmp_path, 300)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for top in TOPS
        for p in (REPO / top).rglob("*.py")
        if p.name != "__main__.py"
    }
    assert expected <= set(report["modules"]), sorted(expected - set(report["modules"]))
    assert report["outside"] == []
    assert report["specs"] == ["agent.yaml", "orchestrator.yaml"]
    assert report["typed"]  # PEP 561: type checkers read the SDK's hints
    assert report["dashboard"] == ["dashboard.css", "dashboard.js", "index.html"]  # (offline)
    version = _run([str(python.parent / "mistk-rl"), "--version"], tmp_path, 60).stdout
    assert version.startswith("mistk-rl 0.") and "HTTP API 1." in version


def test_wheel_runs_the_main_job(wheel_venv, tmp_path):
    """The README's main job from the installed console script, in a directory with no
    source tree: the services it starts import the installed packages."""
    python, _ = wheel_venv
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = _run(
        [
            str(python.parent / "mistk-rl"),
            "run",
            "configs/cartpole_random.yaml",
            "--quiet",
            "--dashboard",
            "0",
            "--out",
            str(tmp_path / "run"),
        ],
        tmp_path,
        300,
        env=env,
    )
    assert "mistk-rl run: dashboard at http://127.0.0.1:" in done.stdout
    services = json.loads((tmp_path / "run" / "services.json").read_text())
    assert {s["role"] for s in services.values()} == {"agent", "orchestrator"}
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    episodes = [
        json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()
    ]
    assert results["episode_count"] == len(episodes)
    assert len(episodes) == 3 and all(e["length"] >= 1 for e in episodes)
    assert all(e["return"] == e["length"] for e in episodes)  # CartPole: +1 a step


# Each optional extra's packages (setup.cfg's extras_require), absent as where the Dockerfile
# installs install_requires alone
EXTRAS_PACKAGES = ("dm_env_rpc", "grpc", "ray", "stable_baselines3", "onnx", "opentelemetry")
WITHOUT_EXTRAS = f"""
import importlib, json, pkgutil, sys
for name in {EXTRAS_PACKAGES!r}:
    sys.modules[name] = None  # (importing it raises ImportError)
failed = []
for top in ("agents", "orchestrators"):
    for info in pkgutil.walk_packages(importlib.import_module(top).__path__, top + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed.append([info.name, str(exc)])
from mistk_rl.errors import InvalidRequest
from orchestrators.gym_orchestrator import _env_fn
try:
    _env_fn({{"id": "remote", "dmEnvRpc": {{"address": "127.0.0.1:1"}}}}, {{}})
    refused = None
except InvalidRequest as exc:
    refused = str(exc)
print(json.dumps({{"failed": failed, "refused": refused}}))
"""


def test_every_agent_and_orchestrator_imports_without_the_optional_extras():
    """The compose stack's image has install_requires alone: every agent and orchestrator
    module imports without the extras' packages (the gym orchestrator once imported the
    dm_env_rpc bridge at its top, and did not start there), and asking for what an extra
    gives is a 400 that names the extra."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["failed"] == []
    assert "env.dmEnvRpc needs the dm_env_rpc extra" in found["refused"]
