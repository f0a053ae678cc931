"""Fixtures that start real services (gunicorn on 127.0.0.1, free ports) and stop them."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest

from mistk_rl.deploy.launch import ServiceProcess, group_members, spawn_service, wait_ready

# (as mistk_rl.bridges sets it: tests that import dm_env_rpc first get it too; a worker
# that has run gRPC tests forks services, and gRPC's fork handlers may abort those children)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
RANDOM_AGENT = "agents.random_agent:RandomAgent"
GYM_ORCHESTRATOR = "orchestrators.gym_orchestrator:GymOrchestrator"
REPO = Path(__file__).resolve().parent.parent
# a shell starts background jobs (`cmd &`) with SIGINT ignored; a harness started from such
# a process inherits that, as any program does, and Python then installs no handler for it
SIGINT_IGNORED = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    reason="SIGINT is ignored here (a background job)",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long(seconds): a test that takes about this long on 2 cores (its module runs first)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules with `long` tests first, the longest first, each module's tests kept
    together and in order: pytest-xdist's workers then share out the many short tests at
    the end, instead of one finishing a minute-long test alone while the other idles (the
    longest-first rule). The other modules keep pytest's order."""
    weight: dict[str, float] = {}
    for item in items:
        mark = item.get_closest_marker("long")
        if mark is not None:
            weight[item.nodeid.split("::")[0]] = weight.get(item.nodeid.split("::")[0], 0.0) + (
                float(mark.args[0]) if mark.args else 30.0
            )
    first = sorted(weight, key=lambda module: -weight[module])
    rank = {module: k for k, module in enumerate(first)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def group_alive(pgid: int) -> bool:
    """Any live process left in the service's process group (zombies do not count)."""
    return bool(group_members(pgid))


@pytest.fixture
def launch(tmp_path: Path, monkeypatch) -> Callable[..., ServiceProcess]:
    """Start a service; every one started is stopped at teardown, leaving no process."""
    monkeypatch.chdir(REPO)  # services import agents/, orchestrators/ and tests/ from here
    started: list[ServiceProcess] = []

    def _launch(
        role: str,
        target: str,
        *,
        token: Optional[str] = None,
        extra_args: Sequence[str] = (),
        wait: bool = True,
    ) -> ServiceProcess:
        """`wait=False`: spawned only, so that several boot side by side; `wait_ready` it."""
        name = f"{role}{len(started)}"
        service = spawn_service(
            role,
            target,
            data_dir=tmp_path / name,
            log_path=tmp_path / f"{name}.log",
            token=token,
            extra_args=extra_args,
        )
        started.append(service)
        if wait:
            wait_ready(service, 60)
        return service

    yield _launch
    for service in started:  # all shut down side by side
        service.begin_stop()
    for service in started:
        service.stop()
    leftovers = [s.process.pid for s in started if group_alive(s.process.pid)]
    assert not leftovers, f"processes left behind: {leftovers}"
