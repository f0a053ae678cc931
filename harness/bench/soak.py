"""`mistk-rl bench soak`: long runs side by side, the memory of every service sampled as they
go. Each config runs as ``mistk-rl run CONFIG`` (its own process, as a user starts it) for
the given minutes and is then stopped with SIGTERM, as an operator stops one; meanwhile
every `interval_s` the resident memory (RSS, from /proc) of each service it started (the
``mistk-rl serve`` process with its workers and env processes) and of the harness itself is
recorded. A service whose memory is bounded stays flat after its warm-up: the record gives
each one's RSS at the first sample after `warmup_s`, at the middle and at the end, and the
largest change from the first of those.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PAGE = os.sysconf("SC_PAGE_SIZE")
SOAK_CONFIGS = [
    Path("configs/soak") / name
    for name in ("gym_ppo_64.yaml", "tictactoe_league.yaml", "thinker_ppo.yaml")
]


@dataclass
class _Run:
    config: Path
    out: Path
    process: subprocess.Popen
    samples: list[dict] = field(default_factory=list)  # {"t": s, "rss": {service: bytes}}


def bench_soak(
    configs: list[Path],
    minutes: float = 30.0,
    interval_s: float = 30.0,
    warmup_s: Optional[float] = None,
    out_dir: Optional[Path] = None,
) -> list[dict]:
    """Run `configs` side by side for `minutes`; one record per config (module doc).
    `warmup_s`: the samples before it are not compared (default: a tenth of the run, at
    most 3 minutes: replay buffers fill, snapshots load)."""
    duration = minutes * 60.0
    warmup = min(180.0, duration / 10) if warmup_s is None else warmup_s
    root = Path(out_dir or tempfile.mkdtemp(prefix="mistk-soak-"))
    runs = [_start(config, root / f"{i}-{config.stem}") for i, config in enumerate(configs)]
    started = time.monotonic()
    try:
        while (now := time.monotonic() - started) < duration:
            for run in runs:
                if run.process.poll() is None:
                    run.samples.append({"t": round(now, 1), "rss": service_rss(run.process.pid)})
            if all(run.process.poll() is not None for run in runs):
                break
            time.sleep(min(interval_s, max(0.0, duration - now)))
        for run in runs:
            if run.process.poll() is None:
                run.samples.append({"t": round(now, 1), "rss": service_rss(run.process.pid)})
    finally:
        ended = {id(run): _stop(run.process) for run in runs}
    records = [_record(run, warmup, duration, ended[id(run)]) for run in runs]
    for record in records:
        print(_summary(record))
    return records


def _start(config: Path, out: Path) -> _Run:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".log"), "wb") as log:  # (the child keeps its own copy)
        process = subprocess.Popen(
            [sys.executable, "-m", "harness", "run", str(config), "--out", str(out), "--quiet"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return _Run(config, out, process)


def _stop(process: subprocess.Popen, timeout: float = 120.0) -> dict:
    """SIGTERM, as an operator stops a run; the harness takes its services down. Killed
    only if it has not exited within `timeout` (the record says so)."""
    if process.poll() is not None:
        return {"exit": process.returncode, "stopped_by_bench": False}
    process.send_signal(signal.SIGTERM)
    try:
        return {"exit": process.wait(timeout), "stopped_by_bench": True}
    except subprocess.TimeoutExpired:
        process.kill()
        return {"exit": process.wait(), "stopped_by_bench": True, "killed": True}


def service_rss(harness_pid: int) -> dict[str, int]:
    """RSS in bytes of the harness (its own process) and of each service it started: a
    child ``mistk_rl serve ROLE TARGET ... --data-dir DIR`` with every process under it,
    named ROLE:DIR's last part."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    rss = {"harness": _rss(harness_pid)}
    for child in children.get(harness_pid, []):
        argv = _cmdline(child)
        if "serve" not in argv:
            continue
        role = argv[argv.index("serve") + 1] if argv.index("serve") + 1 < len(argv) else "?"
        data = argv[argv.index("--data-dir") + 1] if "--data-dir" in argv else str(child)
        tree, total = [child], 0
        while tree:
            pid = tree.pop()
            total += _rss(pid)
            tree += children.get(pid, [])
        rss[f"{role}:{Path(data).name}"] = total
    return rss


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # (gone meanwhile)
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _record(run: _Run, warmup: float, duration: float, ended: dict) -> dict:
    """RSS per service at the first sample after the warm-up, the middle and the end."""
    kept = [s for s in run.samples if s["t"] >= warmup] or run.samples[-1:]
    services: dict[str, dict] = {}
    if kept:
        first, middle, last = kept[0], kept[len(kept) // 2], kept[-1]
        for name in first["rss"]:
            points = [s["rss"].get(name, 0) for s in (first, middle, last)]
            series = [s["rss"].get(name, 0) for s in kept]
            base = points[0] or 1
            services[name] = {
                "mib": [round(p / 2**20, 1) for p in points],
                "at_s": [first["t"], middle["t"], last["t"]],
                "max_change": round(max(abs(v - points[0]) for v in series) / base, 4),
            }
    return {
        "config": str(run.config),
        "run_dir": str(run.out),
        "minutes": round(duration / 60, 2),
        "warmup_s": warmup,
        "samples": len(run.samples),
        "services": services,
        "series": run.samples,
        **ended,
    }


def _summary(record: dict) -> str:
    lines = [f"{record['config']} ({record['samples']} samples, exit {record['exit']}):"]
    for name, s in record["services"].items():
        start, middle, end = s["mib"]
        lines.append(
            f"  {name:28s} {start:8.1f} {middle:8.1f} {end:8.1f} MiB "
            f"(at {s['at_s'][0]:.0f}/{s['at_s'][1]:.0f}/{s['at_s'][2]:.0f} s), "
            f"largest change {100 * s['max_change']:.1f}%"
        )
    return "\n".join(lines)
