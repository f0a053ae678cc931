"""Env managers: same trajectories, supervision of failing envs, no orphan processes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mistk_rl.rl.envs import (
    MANAGERS,
    AsyncSubprocessEnvManager,
    BaseEnvManager,
    EnvManagerError,
    SubprocessEnvManager,
    make_env_fns,
)
from tests.rl.faulty_env import Faulty, Slow

CARTPOLE = make_env_fns("CartPole-v1", None, 1)[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone: it is only waiting to be reaped
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _trajectories(manager, steps: int = 120) -> dict[int, list]:
    """Per-env (obs, reward, done) sequences, each env acting on its own step count, so a
    trajectory does not depend on which envs a step returns together (the async manager
    groups them by arrival, which varies with load)."""
    out: dict[int, list] = {i: [] for i in range(manager.env_num)}
    while min(map(len, out.values())) < steps:
        actions = {
            i: int((len(out[i]) + i) % 3 == 0) for i in manager.ready_obs if len(out[i]) < steps
        }
        for i, ts in manager.step(actions).items():
            out[i].append((np.round(ts.obs, 6).tolist(), ts.reward, ts.done))
    return out


def abnormal_steps(manager, steps: int, before_step=lambda step: None) -> list[tuple]:
    """Step every copy `steps` times (`before_step(step)` first); the (env, reason) of each
    abnormal timestep. Every copy is ready at each step: a restarted one is back at once."""
    abnormal = []
    for step in range(steps):
        before_step(step)
        ready = manager.ready_obs
        assert set(ready) == set(range(manager.env_num))
        for i, ts in manager.step({i: 0 for i in ready}).items():
            if ts.abnormal:
                abnormal.append((i, ts.info["abnormal"]))
    return abnormal


def test_managers_give_identical_trajectories_for_the_same_seed():
    results = {}
    for name, cls in MANAGERS.items():
        with cls([CARTPOLE] * 3, {"wait_num": 2} if name == "async" else None) as manager:
            manager.launch(seed=7)
            results[name] = _trajectories(manager)
    assert results["base"] == results["subprocess"] == results["async"]
    assert any(done for traj in results["base"].values() for _, _, done in traj)  # auto-reset


@pytest.mark.parametrize("cls", [BaseEnvManager, SubprocessEnvManager])
@pytest.mark.parametrize("mode", ["raise", "exit", "hang"])
def test_a_failing_env_is_restarted_and_reported_while_others_go_on(tmp_path, cls, mode):
    if cls is BaseEnvManager and mode == "exit":
        pytest.skip("os._exit in-process ends the caller: that is what subprocesses are for")
    fns = [CARTPOLE, Faulty(mode, at=5, marker=str(tmp_path / "m")), CARTPOLE]
    timeout = 0.5 if cls is SubprocessEnvManager else 0.2
    if mode == "hang" and cls is BaseEnvManager:  # in-process: noticed when the step returns
        fns[1] = Faulty("hang-short", at=5, marker=str(tmp_path / "m"))
    with cls(fns, {"step_timeout": timeout}) as manager:
        manager.launch(seed=0)
        abnormal = abnormal_steps(manager, 20)
        assert [i for i, _ in abnormal] == [1]
        assert manager.stats["restarts_per_env"] == [0, 1, 0]
        reason = abnormal[0][1]
        expected = {
            "raise": "injected env failure",
            "exit": "died",
            "hang": "hung" if cls is SubprocessEnvManager else "step_timeout",
        }[mode]
        assert expected in reason


def test_an_env_that_keeps_failing_is_retired_then_the_manager_gives_up(tmp_path):
    always = Faulty("raise", at=1, marker=str(tmp_path / "m"), always=True)
    with SubprocessEnvManager([CARTPOLE, always], {"max_retry": 2}) as manager:
        manager.launch(seed=0)
        manager.step({0: 0, 1: 0})
        manager.step({0: 0, 1: 0})
        assert manager.stats["retired"] == [1] and set(manager.ready_obs) == {0}
    with BaseEnvManager([always], {"max_retry": 2}) as manager:
        manager.launch(seed=0)
        with pytest.raises(EnvManagerError, match="every env failed"):
            manager.step({0: 0})
            manager.step({0: 0})


def test_close_leaves_no_worker_behind_also_after_a_crash(tmp_path):
    manager = SubprocessEnvManager([CARTPOLE, Faulty("exit", 3, str(tmp_path / "m"))])
    manager.launch(seed=0)
    pids = set(manager.worker_pids)
    for _ in range(5):
        manager.step({i: 0 for i in manager.ready_obs})
    pids |= set(manager.worker_pids)  # includes the replacement of the crashed worker
    assert len(pids) == 3
    manager.close()
    assert not [pid for pid in pids if _alive(pid)]
    assert manager.done
    with pytest.raises(EnvManagerError):
        manager.step({0: 0})


def test_async_manager_returns_the_fast_envs_first():
    fns = [CARTPOLE, CARTPOLE, Slow(0.3)]
    with AsyncSubprocessEnvManager(fns, {"wait_num": 2, "wait_timeout": 5.0}) as manager:
        manager.launch(seed=0)
        first = manager.step({i: 0 for i in manager.ready_obs})
        assert set(first) == {0, 1}  # (the slow env's step, 0.3 s, is still in flight)
        assert manager.in_flight == [2] and set(manager.ready_obs) == {0, 1}
        later = {}
        while 2 not in later:
            later.update(manager.step({i: 0 for i in manager.ready_obs}))
        assert not later[2].abnormal


def test_step_refuses_envs_that_are_not_ready():
    with BaseEnvManager([CARTPOLE]) as manager:
        with pytest.raises(EnvManagerError, match="launch"):
            manager.step({0: 0})
        manager.launch(seed=0)
        with pytest.raises(ValueError, match="not waiting"):
            manager.step({5: 0})
