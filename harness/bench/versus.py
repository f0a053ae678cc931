"""`mistk-rl bench versus --baseline DIR`: the step path of the services as this checkout
runs them against those of another checkout (a commit before a change, or the same code with
a piece taken out), side by side.

A shared machine's speed drifts by tens of percent within a minute, so two benchmark runs
one after the other cannot resolve a few percent. Here both sides run at once: a RandomAgent
service from each tree (``python -m mistk_rl serve`` with that tree first on its path, as
`mistk_rl.deploy.launch` starts services from the working directory), driven in blocks of
about a second, taking turns, the order swapped every round, so drift falls on both. Per
mode (HTTP stepColumns, the step stream) and copy count: each side's median rate, the ratio
this / baseline (the geometric mean of the rounds' ratios, a 95% bootstrap interval, the
median and range), and each service's own CPU time per env step (read from /proc for its
process group; the machine's steal inflates it less than wall time). The driver runs on one
CPU and both services on the others (`_pin`), so neither service is favoured by sharing the
driver's.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import gymnasium as gym
import numpy as np

from harness.bench.step import measure_steps, start_random_agent
from mistk_rl.deploy.launch import group_members

MODES = ("http", "stream")
BOOTSTRAP = 5000


@contextlib.contextmanager
def _in(directory: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def _cpu_seconds(pgid: int) -> float:
    """User and system CPU time of the live processes in group `pgid`."""
    ticks = 0
    for pid in group_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def bench_versus(
    baseline: Path, env_counts: list[int], rounds: int = 20, block_s: float = 1.0
) -> list[dict]:
    from orchestrators.gym_orchestrator import binary_for

    if not (baseline / "mistk_rl").is_dir():
        raise SystemExit(f"bench versus: {baseline} is not a checkout (no mistk_rl/ in it)")
    space = gym.make("CartPole-v1").observation_space
    sides = {"this": Path.cwd(), "baseline": baseline.resolve()}
    records = []
    with tempfile.TemporaryDirectory(prefix="mistk-versus-") as tmp:
        started, pinned = {}, None
        try:
            for side, tree in sides.items():
                with _in(tree):
                    started[side] = start_random_agent(Path(tmp) / side)
            pinned = _pin([service.process.pid for service, _ in started.values()])

            def block(side: str, mode: str, n: int, steps: int) -> tuple[float, float]:
                """(env steps/s, service CPU us per env step) of one block."""
                service, client = started[side]
                capabilities = frozenset({"columns", "stream"} if mode == "stream" else {"columns"})
                client.binary = mode == "stream" and binary_for(
                    capabilities | {"tensors"}, space, n, 1
                )
                cpu = _cpu_seconds(service.process.pid)
                taken, seconds, _ = measure_steps(client, capabilities, n, steps)
                return taken / seconds, (_cpu_seconds(service.process.pid) - cpu) / taken * 1e6

            for mode in MODES:
                for n in env_counts:
                    steps = max(n * 20, int(block("this", mode, n, 500)[0] * block_s))
                    got: dict[str, list[tuple[float, float]]] = {s: [] for s in sides}
                    for r in range(rounds):
                        for side in list(sides)[:: 1 if r % 2 == 0 else -1]:
                            got[side].append(block(side, mode, n, steps))
                    records.append(_record(mode, n, rounds, steps, got))
        finally:
            for service, client in started.values():
                client.close()
                service.stop()
            if pinned is not None:
                os.sched_setaffinity(0, pinned)
    return [{**record, "pinned": pinned is not None} for record in records]


def _pin(pgids: list[int]) -> Optional[set[int]]:
    """With two CPUs or more, this process (the driver) on the first and both services on
    the others: which service shares a CPU with the driver would otherwise favour one side
    (a few percent, measured, the sign following the order they started in). Returns this
    process's CPUs before, to restore; None where it cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        return None
    driver, *others = sorted(mine)
    for pgid in pgids:
        for pid in group_members(pgid):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, set(others))
    os.sched_setaffinity(0, {driver})
    return mine


def _record(
    mode: str, n: int, rounds: int, steps: int, got: dict[str, list[tuple[float, float]]]
) -> dict:
    logs = np.log([a[0] / b[0] for a, b in zip(got["this"], got["baseline"])])
    rng = np.random.default_rng(0)
    boots = np.exp(rng.choice(logs, (BOOTSTRAP, len(logs))).mean(axis=1))
    low, high = np.percentile(boots, [2.5, 97.5])
    ratios = np.exp(logs)
    record = {
        "bench": "versus",
        "mode": mode,
        "envs": n,
        "rounds": rounds,
        "steps_per_block": steps,
        **{f"{s}_steps_per_s": round(float(np.median([g[0] for g in got[s]])), 1) for s in got},
        "ratio": round(float(np.exp(logs.mean())), 4),
        "ratio_interval": [round(float(low), 4), round(float(high), 4)],
        "ratio_median": round(float(np.median(ratios)), 4),
        "ratio_range": [round(float(ratios.min()), 3), round(float(ratios.max()), 3)],
        **{f"{s}_cpu_us_per_step": round(float(np.median([g[1] for g in got[s]])), 2) for s in got},
    }
    print(
        f"  versus {mode:6s} envs {n:4d}: this / baseline {record['ratio']:.3f} "
        f"[{low:.3f}, {high:.3f}] over {rounds} rounds (median {record['ratio_median']:.3f}); "
        f"service CPU {record['this_cpu_us_per_step']:.2f} / "
        f"{record['baseline_cpu_us_per_step']:.2f} us per env step"
    )
    return record
