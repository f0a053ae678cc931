"""`mistk-rl bench`: measurements of the services, printed and optionally saved as JSON.
(transport/envs: `step`; sb3-*: `sb3`; parity and its aliases learning-*: `parity`;
faults: `faults`; games: `games`; thinker-*: `thinker`.)

getaction: the round-trip time of getAction against a local RandomAgent service (gunicorn on
loopback, one kept-alive connection, a CartPole-sized observation), after a warm-up; then,
in the same sitting, the machine's floor under it (`floor`: a bare echo and the services'
server stack answering a constant). With ``--awake`` (getaction, transport) every CPU is
kept from idling meanwhile (`floor.cpus_kept_awake`), and the records say so. With ``--spin
US`` (getaction, transport) the bench runs with ``MISTK_RL_SPIN_US=US``, as a user can set
it: its clients wait for each answer awake for up to US microseconds (`mistk_rl.sdk.transport`)
and the services it starts wait so for the next request after each answer; without it, as
without the variable, both wait so for up to 1 ms with two CPUs or more
(`mistk_rl.wire.spin.default_spin`). The records carry it: ``spin_us``.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union
from unittest.mock import patch


def bench_getaction(n: int = 2000, warmup: int = 200) -> dict:
    import gymnasium as gym

    from harness.bench.floor import latency_record, time_calls
    from harness.bench.step import start_random_agent

    obs, _ = gym.make("CartPole-v1").reset(seed=0)
    with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
        service, agent = start_random_agent(Path(tmp), name="player")
        try:
            agent.episode_started({"player": obs})
            request = {"player": obs}
            times = time_calls(lambda: agent.get_action(request), n, warmup)
            agent.close()
        finally:
            service.stop()
    return {"bench": "getaction", **latency_record(times)}


def bench_long_polls(polls: int = 64) -> dict:
    """reset and terminate of an agent while `polls` callers long-poll its status (each on
    its own connection, waiting for the version it has): the control path's latency under
    a crowd of waiting observers."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.bench.step import start_random_agent

    with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
        service, agent = start_random_agent(Path(tmp), name="player")
        clients = [service.client(timeout=30) for _ in range(polls)]
        try:
            with ThreadPoolExecutor(polls) as pool:
                version = agent.status().resource_version
                waits = [pool.submit(c.status, version, 60) for c in clients]
                time.sleep(1.0)  # a bench, not a test: let every poll reach the service
                timings = {}
                for name, call in (
                    ("reset", lambda: agent.reset(unload_model=False)),
                    ("terminate", agent.terminate),
                ):
                    start = time.perf_counter()
                    call()
                    timings[name] = time.perf_counter() - start
                woken = sum(w.result(timeout=30).resource_version > version for w in waits)
        finally:
            for c in clients:
                c.close()
            agent.close()
            service.stop()
    return {
        "bench": "longpolls",
        "long_polls": polls,
        "woken_by_reset": woken,
        "reset_ms": round(timings["reset"] * 1e3, 1),
        "terminate_ms": round(timings["terminate"] * 1e3, 1),
    }


def bench_sb3(
    algo: str, seed: int, eval_every: Optional[int], config_path: Optional[Path] = None
) -> dict:
    """SB3 alone on a training config (default: the suite's CartPole entry for `algo`)."""
    from harness.bench.parity import entry_path
    from harness.bench.sb3 import run_sb3
    from harness.config import load_config

    config = load_config(config_path or entry_path(f"{algo}_cartpole"))
    if eval_every is not None and config.training is not None:  # (none: run_sb3 says so)
        config = config.model_copy(
            update={"training": config.training.model_copy(update={"eval_every": eval_every})}
        )
    record = run_sb3(config, seed=seed)
    for e in record["evals"]:
        print(
            f"  eval at {e['env_steps']:7d} env steps ({e['wall_s']:7.1f} s): "
            f"mean return {e['mean_return']:7.2f}"
        )
    return record


def bench_parity(
    suite: str = "classic",
    seeds: Optional[list[int]] = None,
    entries: Optional[list[str]] = None,
    config: Optional[Path] = None,
    json_out: Optional[Path] = None,
    local_inference: bool = False,
    saved: Optional[list[Path]] = None,
) -> int:
    from harness.bench.parity import DEFAULT_SEEDS, SUITES, resummarize, summary_table
    from harness.bench.parity import bench_parity as run_parity

    if saved:  # only the summary of records run before
        records = [r for path in saved for r in json.loads(path.read_text())["records"]]
        summaries = resummarize(records)
        print(summary_table(summaries))
        if json_out is not None:
            _write(json_out, records, summaries=summaries)
        return 0
    if config is not None:
        names = [config.stem]
    else:
        names = entries or SUITES[suite]
        known = {n for suite_entries in SUITES.values() for n in suite_entries}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown suite entries {unknown}; known: {sorted(known)}")
    records, summaries = run_parity(names, seeds or DEFAULT_SEEDS[suite], config, local_inference)
    if json_out is not None:
        _write(json_out, records, summaries=summaries)
    return 0


@dataclass(frozen=True)
class BenchOptions:
    """What `mistk-rl bench` was given (`harness.cli`'s BENCH_OPTIONS say which benchmark
    reads which)."""

    n: Optional[int] = None
    json_out: Optional[Path] = None
    seed: int = 0
    eval_every: Optional[int] = None
    env_counts: Optional[list[int]] = None
    steps: int = 20000
    seeds: Optional[list[int]] = None
    config: Optional[Path] = None
    suite: str = "classic"
    entries: Optional[list[str]] = None
    behaviour: str = "solver"
    local_inference: bool = False
    saved: Optional[list[Path]] = None
    arms: Optional[list[str]] = None
    awake: bool = False
    spin_us: Optional[float] = None
    minutes: float = 30.0
    baseline: Optional[Path] = None


def run_bench(what: str, **options: Any) -> int:
    """Run the benchmark `what` (`BENCH_RUNNERS`) with `BenchOptions(**options)`; its
    records go to ``json_out`` when given. `awake` (getaction, transport): every CPU kept
    from idling while it runs (`harness.bench.floor.cpus_kept_awake`); `spin_us`: the
    clients wait for answers awake that long, and the services for requests
    (``MISTK_RL_SPIN_US``, which None leaves as it is). Their records say which
    (``cpus_awake``, ``spin_us``)."""
    opts = BenchOptions(**options)
    for flag, given in (("--awake", opts.awake), ("--spin", opts.spin_us is not None)):
        if given and what not in ("getaction", "transport"):
            raise SystemExit(f"bench {what}: {flag} is for getaction and transport")
    records = BENCH_RUNNERS[what](what, opts)
    if isinstance(records, int):  # (parity writes its own records)
        return records
    if opts.json_out is not None:
        _write(opts.json_out, records)
    return 0


def _step_path(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.floor import cpus_kept_awake
    from mistk_rl.wire.spin import default_spin

    with cpus_kept_awake() if opts.awake else nullcontext(), _spinning(opts.spin_us):
        spins = {"spin_us": round(default_spin() * 1e6, 3)}
        if what == "getaction":
            records = _getaction(opts.n)
        else:
            records = _transport(opts.env_counts or [1, 16, 64, 256], opts.steps)
    records = [{**record, "cpus_awake": opts.awake, **spins} for record in records]
    if what == "getaction":
        for record in records:
            print("  ".join(f"{k}={v}" for k, v in record.items()))
    return records


def _parity(what: str, opts: BenchOptions) -> int:
    if what.startswith("learning-"):  # the suite's CartPole entry (or --config) for the algo
        entry = f"{what.split('-')[1]}_cartpole"
        return bench_parity(
            "classic", opts.seeds, [entry], opts.config, opts.json_out, opts.local_inference
        )
    return bench_parity(
        opts.suite,
        opts.seeds,
        opts.entries,
        opts.config,
        opts.json_out,
        opts.local_inference,
        opts.saved,
    )


def _envs(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.step import bench_envs

    return bench_envs(opts.env_counts or [1, 16, 64, 256], opts.steps)


def _games(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.games import bench_games

    return bench_games(opts.env_counts or [1, 16, 64], opts.steps)


def _thinker_agent(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.thinker_agent import ARMS, bench_thinker_agent

    unknown = sorted(set(opts.arms or ()) - set(ARMS))
    if unknown:
        raise SystemExit(
            f"bench thinker-agent: unknown arms {', '.join(unknown)}; valid: {', '.join(ARMS)}"
        )
    return bench_thinker_agent(
        opts.seeds or (0, 1, 2, 3, 4),
        real_steps=opts.n or 200_000,
        arms=opts.arms or ("raw", "thinker"),
    )


def _thinker(what: str, opts: BenchOptions) -> Union[list[dict], dict[str, Any]]:
    """thinker-planner's rows; thinker-model's and thinker-ppo's figures (one dict)."""
    from harness.bench import thinker as bench_thinker

    if what == "thinker-planner":
        return bench_thinker.bench_planner(episodes=opts.n or 3000, seed=opts.seed)
    if what == "thinker-model":
        return bench_thinker.bench_model(
            real_steps=opts.n or 20000, seed=opts.seed, behaviour=opts.behaviour
        )
    return bench_thinker.bench_ppo(opts.seeds or (0, 1, 2))


def _cluster(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.cluster import bench_cluster, bench_cluster_loss

    if what == "cluster":
        return bench_cluster(opts.env_counts or [1, 64], opts.steps, league_steps=opts.n or 10_000)
    return bench_cluster_loss(opts.seeds or [0])


def _faults(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.faults import bench_faults

    return bench_faults()


def _bridges(what: str, opts: BenchOptions) -> list[dict]:
    """dm-env-rpc and gymnasium: the bridges' rates and SB3 through the gymnasium facade."""
    if what == "dm-env-rpc":
        from harness.bench.dm_env_rpc import bench_dm_env_rpc

        return bench_dm_env_rpc(opts.steps)
    from harness.bench.gymnasium_bridge import bench_gymnasium

    return bench_gymnasium(
        tuple(opts.seeds or (0, 1, 2)),
        budget=opts.n or 100_000,
        eval_every=opts.eval_every or 2048,
    )


def _one_record(what: str, opts: BenchOptions) -> list[dict]:
    """longpolls and sb3-*: one record, printed."""
    if what == "longpolls":
        record = bench_long_polls()
    else:
        record = bench_sb3(what.split("-")[1], opts.seed, opts.eval_every, opts.config)
    print("  ".join(f"{k}={v}" for k, v in record.items() if k != "evals"))
    return [record]


def _burst(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.burst import bench_burst

    return bench_burst(runs=opts.n or 3)


def _versus(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.versus import bench_versus

    if opts.baseline is None:
        raise SystemExit("bench versus: give --baseline DIR (the other checkout)")
    return bench_versus(opts.baseline, opts.env_counts or [1, 64], opts.n or 20)


def _soak(what: str, opts: BenchOptions) -> list[dict]:
    from harness.bench.soak import SOAK_CONFIGS, bench_soak

    configs = [Path(c) for c in str(opts.config).split(",")] if opts.config else SOAK_CONFIGS
    return bench_soak(configs, opts.minutes)


# Each benchmark's runner: its records (written to --json by `run_bench`; thinker-model's
# and thinker-ppo's are their figures, one dict), or an exit code
BENCH_RUNNERS: dict[str, Callable[[str, BenchOptions], Union[list[dict], dict[str, Any], int]]] = {
    "getaction": _step_path,
    "transport": _step_path,
    "parity": _parity,
    "learning-dqn": _parity,
    "learning-ppo": _parity,
    "envs": _envs,
    "games": _games,
    "thinker-agent": _thinker_agent,
    "thinker-planner": _thinker,
    "thinker-ppo": _thinker,
    "thinker-model": _thinker,
    "cluster": _cluster,
    "cluster-loss": _cluster,
    "faults": _faults,
    "longpolls": _one_record,
    "sb3-dqn": _one_record,
    "sb3-ppo": _one_record,
    "dm-env-rpc": _bridges,
    "gymnasium": _bridges,
    "burst": _burst,
    "soak": _soak,
    "versus": _versus,
}


@contextmanager
def _spinning(spin_us: Optional[float]) -> Iterator[None]:
    """Every client made meanwhile waits for answers awake for `spin_us` (the environment
    variable a user would set; checked as a client would). None: as the environment says."""
    from mistk_rl.wire.spin import SPIN_ENV, spin_from_env

    if spin_us is None:
        yield
        return
    with patch.dict(os.environ, {SPIN_ENV: f"{spin_us:g}"}):  # (restored however it ends)
        try:
            spin_from_env()
        except ValueError as exc:
            raise SystemExit(f"bench --spin: {exc}") from None
        yield


def _getaction(n: Optional[int]) -> list[dict]:
    from harness.bench.floor import measure_floor

    return [bench_getaction(n=n or 2000), *measure_floor(n or 2000)]


def _transport(counts: list[int], steps: int) -> list[dict]:
    from harness.bench.floor import measure_floor
    from harness.bench.step import bench_local, bench_transport

    # the floor beside the one-copy rows, which come first
    floor = measure_floor() if 1 in counts else []
    records = bench_transport(counts, steps)
    records += bench_local(counts, steps)  # a learning agent acting remotely or via a copy
    if floor:  # the ratio this machine allows one copy
        records += _one_copy_ceiling(records, floor)
    return records


def _one_copy_ceiling(records: list[dict], floor: list[dict]) -> list[dict]:
    """At one copy a served step is the in-process step plus a round trip, so the served /
    in-process ratio cannot pass in / (in + the floor's round trip) on this machine."""
    echo, asgi = (next(r for r in floor if r["kind"] == kind) for kind in ("echo", "asgi"))
    inprocess = next(r for r in records if r.get("mode") == "inprocess" and r["envs"] == 1)
    step_ms = 1e3 / inprocess["steps_per_s"]
    ceiling = step_ms / (step_ms + asgi["median_ms"])
    print(
        f"  transport ceiling at 1 env: served / in-process <= {ceiling:.2f} here "
        f"(an in-process step {step_ms * 1e3:.0f} us + the bare stack's round trip "
        f"{asgi['median_ms'] * 1e3:.0f} us; a bare echo "
        f"{echo['median_ms'] * 1e3:.0f} us)"
    )
    return [
        *floor,
        {
            "bench": "transport",
            "mode": "ceiling",
            "envs": 1,
            "served_to_inprocess_max": round(ceiling, 3),
        },
    ]


def _write(path: Path, records: Union[list[dict], dict[str, Any]], **extra: list[dict]) -> None:
    """`{"machine": ..., "records": [...], **extra}`: records comparable across runs by a
    script."""
    payload = {
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "records": records,
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
