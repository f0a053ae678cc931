"""What the dashboard shows, as one JSON document built from run directories and the
services' ``/metrics``: nothing here keeps a run's history but the files the harness writes
(progress.json, results.json, the league's league.json) and a bounded window of scrapes.

Runs of the same config (its ``name``) form a group: its curves are the mean over the runs
(seeds) with a band from the lowest to the highest; a group of one run shows, for its
evaluations, the mean return with ± one standard deviation over the evaluation's episodes,
and for its training episodes the 10th to 90th percentile in each bin.
"""

from __future__ import annotations

import json
import math
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.episodes import EPISODES
from harness.games import shown_as
from mistk_rl.league.manager import LeagueManager

SERVICES = "services.json"  # the run's services: name -> {role, url} (the harness writes it)
BINS = 120  # points per training-return curve
LIVE_POINTS = 1800  # scrapes kept per service (an hour at one scrape per 2 s)
SCRAPE_TIMEOUT_S = 2.0


@dataclass
class _Cached:
    mtime_ns: int
    value: Any


class RunFiles:
    """One run directory's files, each re-read only when it changed."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir)
        self._cache: dict[str, _Cached] = {}
        self._episodes_at = 0  # bytes of episodes.jsonl read (`train_episodes`)
        self._steps, self._returns = array("d"), array("d")

    def json(self, relative: str) -> Optional[Any]:
        path = self.dir / relative
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return None
        cached = self._cache.get(relative)
        if cached is None or cached.mtime_ns != mtime:
            try:
                text = path.read_text()
                value = yaml.safe_load(text) if relative.endswith(".yaml") else json.loads(text)
            except (OSError, ValueError, yaml.YAMLError):  # (mid-write elsewhere: next time)
                return cached.value if cached else None
            cached = self._cache[relative] = _Cached(mtime, value)
        return cached.value

    def train_episodes(self) -> np.ndarray:
        """[orchestrator env steps, return] of each training episode in episodes.jsonl
        (for runs that keep no progress.json: no checkpoints), read on from where the last
        call stopped; 16 bytes an episode."""
        path = self.dir / EPISODES
        try:
            size = path.stat().st_size
        except OSError:
            return np.zeros((0, 2))
        if size < self._episodes_at:  # (a new file: a resumed run rewrote it)
            self._episodes_at, self._steps, self._returns = 0, array("d"), array("d")
        if size > self._episodes_at:
            with open(path, "rb") as fh:
                fh.seek(self._episodes_at)
                for line in fh:
                    if not line.endswith(b"\n"):  # (being written: read it next time)
                        break
                    self._episodes_at += len(line)
                    episode = json.loads(line)
                    if episode.get("train") and episode.get("envSteps") is not None:
                        self._steps.append(episode["envSteps"])
                        self._returns.append(episode["return"])
        return np.column_stack((np.frombuffer(self._steps), np.frombuffer(self._returns)))

    def league(self) -> Optional[dict[str, Any]]:
        """The league as it stands: its directory's league.json (saved after every job),
        else the finished run's."""
        state = self.json("league/league.json")
        if state is not None:
            try:
                return LeagueManager.from_state(state).view()
            except (KeyError, TypeError, ValueError):
                pass
        results = self.json("results.json") or {}
        return results.get("league")


class Scraper:
    """Scrapes every service of the runs at most once per `every_s` (the page polls; many
    pages open cost the services one scrape per interval, not one each)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self._last = 0.0
        self._lock = threading.Lock()
        # per service, its last `LIVE_POINTS` scrapes: (time, {metric: value})
        self.samples: dict[str, deque[tuple[float, dict[str, float]]]] = {}
        self.latest: dict[str, dict[str, Any]] = {}
        self._session = requests.Session()

    def scrape(self, services: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.every_s:
                return
            self._last = now
            for key, service in services.items():
                self.latest[key] = self._one(key, service["url"], now)

    def _one(self, key: str, url: str, now: float) -> dict[str, Any]:
        try:
            answer = self._session.get(f"{url.rstrip('/')}/metrics", timeout=SCRAPE_TIMEOUT_S)
            answer.raise_for_status()
        except requests.RequestException as exc:
            return {"up": False, "error": type(exc).__name__}
        values = _flatten(answer.text)
        history = self.samples.setdefault(key, deque(maxlen=LIVE_POINTS))
        history.append((now, values))
        return {"up": True, **_rates(history), **_current(values)}


def _flatten(text: str) -> dict[str, float]:
    """The samples a dashboard reads, summed over their labels except those it keeps."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name == "mistk_lifecycle_state" and sample.value == 1.0:
                out[f"state={sample.labels['state']}"] = 1.0
            elif name in ("mistk_episode_return_mean", "mistk_episodes_total"):
                key = f"{name}{{{sample.labels.get('agent', '')}}}"
                out[key] = sample.value
                out[name] = out.get(name, 0.0) + sample.value
            elif name in (
                "mistk_env_steps_total",
                "mistk_requests_total",
                "mistk_process_resident_memory_bytes",
                "mistk_learner_updates_total",
                "mistk_step_streams_open",
            ):
                out[name] = out.get(name, 0.0) + sample.value
    return out


def _current(values: dict[str, float]) -> dict[str, Any]:
    state = next((k.split("=", 1)[1] for k in values if k.startswith("state=")), None)
    rss = values.get("mistk_process_resident_memory_bytes")
    returns = {
        k[len("mistk_episode_return_mean{") : -1]: round(v, 3)
        for k, v in values.items()
        if k.startswith("mistk_episode_return_mean{")
    }
    return {
        "state": state,
        "envSteps": values.get("mistk_env_steps_total"),
        "rssMiB": None if rss is None else round(rss / 2**20, 1),
        "returnMean": returns,
        "streams": values.get("mistk_step_streams_open"),
    }


def _rates(history: deque) -> dict[str, Optional[float]]:
    """Per-second rates over the last ~10 s of scrapes."""
    now, last = history[-1]
    then, first = next(((t, v) for t, v in history if now - t <= 10.0), history[-1])
    if now - then < 0.5:
        if len(history) < 2:
            return {"envStepsPerS": None, "requestsPerS": None, "episodesPerS": None}
        then, first = history[-2]
    dt = now - then

    def rate(name: str) -> Optional[float]:
        if name not in last or name not in first or dt <= 0:
            return None
        return round(max(0.0, last[name] - first[name]) / dt, 2)

    return {
        "envStepsPerS": rate("mistk_env_steps_total"),
        "requestsPerS": rate("mistk_requests_total"),
        "episodesPerS": rate("mistk_episodes_total"),
    }


def live_returns(scraper: Scraper, key: str) -> list[list[float]]:
    """[env steps, mean return of the last episodes] at each scrape of one orchestrator."""
    samples = scraper.samples.get(key)
    if samples is None:
        return []
    return [
        [v["mistk_env_steps_total"], v["mistk_episode_return_mean"] / _agents(v)]
        for _, v in samples
        if "mistk_env_steps_total" in v and "mistk_episode_return_mean" in v
    ]


def _agents(values: dict[str, float]) -> int:
    return max(1, sum(k.startswith("mistk_episode_return_mean{") for k in values))


class DashboardView:
    """The dashboard's document for `run_dirs` (`build`)."""

    def __init__(self, run_dirs: list[Path], scraper: Optional[Scraper] = None) -> None:
        self.runs = [RunFiles(d) for d in run_dirs]
        self.scraper = scraper or Scraper()
        # the league's ratings as this dashboard saw them change: (max steps, {id: exposure})
        self._seen: deque[tuple[int, dict[str, float]]] = deque(maxlen=LIVE_POINTS)

    def build(self) -> dict[str, Any]:
        services: dict[str, dict[str, Any]] = {}
        for i, run in enumerate(self.runs):
            for name, service in (run.json(SERVICES) or {}).items():
                if not (run.dir / "results.json").exists():  # (a finished run's are gone)
                    services[f"{i}/{name}"] = service
        self.scraper.scrape(services)
        groups: dict[str, list[dict[str, Any]]] = {}
        for i, run in enumerate(self.runs):
            summary = self._run(i, run)
            if summary["state"] != "finished":
                up = any(
                    self.scraper.latest.get(key, {}).get("up")
                    for key in services
                    if key.startswith(f"{i}/")
                )
                summary["state"] = "running" if up else "not running"
            groups.setdefault(summary["name"], []).append(summary)
        league = next((lg for run in self.runs if (lg := run.league()) is not None), None)
        return {
            "updated": time.time(),
            "groups": [_group(name, runs) for name, runs in groups.items()],
            "league": league and {**league["payoff"], "players": league["players"]},
            "ratings": self._ratings(league),
            "services": [
                {
                    "key": key,
                    "run": self.runs[int(key.split("/")[0])].dir.name,
                    "name": key.split("/", 1)[1],
                    **service,
                    **self.scraper.latest.get(key, {"up": False}),
                }
                for key, service in services.items()
            ],
        }

    def _run(self, i: int, run: RunFiles) -> dict[str, Any]:
        config = run.json("config.yaml") or {}
        results = run.json("results.json")
        progress = run.json("progress.json") or {}
        evals = (results or {}).get("evals") or progress.get("evals") or []
        games = config.get("game_training") is not None
        training = config.get("game_training") or config.get("training") or {}
        live = live_returns(self.scraper, f"{i}/orchestrator") if not games else []
        return {
            "name": config.get("name", run.dir.name),
            "dir": run.dir.name,
            "seed": training.get("seed"),
            "state": "finished" if results is not None else "?",
            "unit": "agent steps" if games else "env steps",
            "evals": _game_evals(evals) if games else _gym_evals(evals),
            "train": (
                np.asarray(progress["train_returns"], dtype=float).reshape(-1, 2)
                if progress.get("train_returns")
                else run.train_episodes()
            ),
            "live": live,
            "stopValue": training.get("stop_value"),
        }

    def _ratings(self, league: Optional[dict[str, Any]]) -> dict[str, list[list[float]]]:
        """Each player's TrueSkill exposure (mu - 3 sigma) against the main player's steps:
        at each evaluation the runs saved, then as this dashboard saw league.json change
        (kept for `LIVE_POINTS` changes)."""
        series: dict[str, list[list[float]]] = {}
        for run in self.runs:
            progress = run.json("results.json") or run.json("progress.json") or {}
            for record in progress.get("evals") or []:
                for row in record.get("league", ()):
                    series.setdefault(row["id"], []).append(
                        [record.get("agent_steps", 0), round(row["exposure"], 3)]
                    )
        if league is not None:
            steps = next(
                (r["steps"] for r in league["players"] if r["kind"] == "MainPlayer"),
                max((r["steps"] for r in league["players"]), default=0),
            )
            if not self._seen or self._seen[-1][0] != steps:
                self._seen.append((steps, {r["id"]: r["exposure"] for r in league["players"]}))
        last = max((p[0] for points in series.values() for p in points), default=-1)
        for steps, exposures in self._seen:
            if steps > last:
                for player, exposure in exposures.items():
                    series.setdefault(player, []).append([steps, round(exposure, 3)])
        return series


def _gym_evals(evals: list[dict]) -> list[dict[str, float]]:
    return [
        {"x": e["env_steps"], "mean": e["mean_return"], "std": e.get("std_return") or 0.0}
        for e in evals
        if e.get("mean_return") is not None and math.isfinite(e["mean_return"])
    ]


def _game_evals(evals: list[dict]) -> dict[str, list[dict[str, float]]]:
    """Win rate per opponent and seat ("random / player_1") at each evaluation; an
    opponent the agent trains on is marked ("winblock (trained against) / player_0")."""
    series: dict[str, list[dict[str, float]]] = {}
    for record in evals:
        for opponent, result in record.get("evaluation", {}).items():
            for seat, r in result.get("seats", {}).items():
                series.setdefault(f"{shown_as(opponent, result)} / {seat}", []).append(
                    {"x": record["agent_steps"], "mean": r["win"], "std": 0.0}
                )
    return series


def _group(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A config's runs with their bands (module doc)."""
    unit = runs[0]["unit"]
    if unit == "agent steps":
        keys = sorted({k for r in runs for k in r["evals"]})
        evals = {k: _band([r["evals"].get(k, []) for r in runs]) for k in keys}
    else:
        evals = {"mean return": _band([r["evals"] for r in runs])}
    train = _train_band([r["train"] for r in runs])
    return {
        "name": name,
        "unit": unit,
        "runs": [{k: r[k] for k in ("dir", "seed", "state")} for r in runs],
        "evals": evals,
        "train": train,
        "live": [r["live"] for r in runs if r["live"]],
        "stopValue": runs[0]["stopValue"],
        "seeds": len(runs),
    }


def _band(per_run: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Mean over runs at each evaluation point, lowest to highest (one run: ± std)."""
    per_run = [r for r in per_run if r]
    if not per_run:
        return []
    if len(per_run) == 1:
        return [
            {"x": p["x"], "mean": p["mean"], "lo": p["mean"] - p["std"], "hi": p["mean"] + p["std"]}
            for p in per_run[0]
        ]
    xs = sorted({p["x"] for r in per_run for p in r})
    out = []
    for x in xs:
        values = [p["mean"] for r in per_run for p in r if p["x"] == x]
        if len(values) == len(per_run):  # (points every run reached)
            out.append(
                {"x": x, "mean": float(np.mean(values)), "lo": min(values), "hi": max(values)}
            )
    return out


def _train_band(per_run: list[np.ndarray]) -> list[dict[str, float]]:
    """Training-episode returns ((steps, return) rows) in `BINS` bins of steps: one run's
    mean and 10th-90th percentile per bin; several runs' mean of their bin means, lowest to
    highest."""
    per_run = [r for r in per_run if len(r) > 1]
    if not per_run:
        return []
    end = min(float(r[:, 0].max()) for r in per_run)
    edges = np.linspace(0, end, BINS + 1)
    binned = []
    for run in per_run:
        run = run[run[:, 0] <= end]
        which = np.clip(np.searchsorted(edges, run[:, 0], side="right") - 1, 0, BINS - 1)
        binned.append([run[which == b, 1] for b in range(BINS)])
    out = []
    for b in range(BINS):
        parts = [bins[b] for bins in binned]
        if any(len(p) == 0 for p in parts):
            continue
        x = float((edges[b] + edges[b + 1]) / 2)
        if len(parts) == 1:
            lo, hi = np.percentile(parts[0], [10, 90])
            out.append({"x": x, "mean": float(parts[0].mean()), "lo": float(lo), "hi": float(hi)})
        else:
            means = [float(p.mean()) for p in parts]
            out.append({"x": x, "mean": float(np.mean(means)), "lo": min(means), "hi": max(means)})
    return out
