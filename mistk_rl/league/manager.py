"""The league manager: players, payoff and ratings, job slots, snapshots, and its whole
state saved and restored (a restarted league continues the same league).

No threads and no I/O but `save`/`load`: the caller launches the jobs the manager hands
out and reports how they ended (through `mistk_rl.league.jobs.LeagueJobs`, which tells the
scheduler too), asks whether a player is due a snapshot and tells it where the snapshot's
checkpoint was saved.

- The league starts with a snapshot of every main player's initial weights, so the
  branches that need historical players always have candidates.
- At most `max_active_player_job` jobs per player are running; a slot is released when its
  job finishes, fails to launch or times out (`finish_job`, `fail_job`). `jobs_launched`
  counts the jobs handed out (their ids), `jobs_finished` and `jobs_failed` how they ended
  (the others are still running or waiting for agents).
- Every finished game updates the payoff (self-play games excepted) and the ratings. A
  solo player's finished job (episodes against the env) goes to `solo_payoff`
  (`SoloSharedPayoff`: its last jobs, each with the episodes' mean return).
- `take_snapshot` adds the frozen copy and says whether the player now resets to its
  initial weights (only the snapshotted player can); a player with `forget_on_reset`
  loses its payoff records then (it starts again from the prior).
- Every job's end (finished or failed) is a record: the last `RECENT_JOBS` are in the
  state (`recent`), and `save` appends the ones since the last save to ``jobs.jsonl``
  beside the state file, so the whole history of who played whom, in which branch, with
  what result and at which of the player's moves (``at_step``) is kept.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from mistk_rl.files import atomic_write_json
from mistk_rl.league.payoff import BattleSharedPayoff, Result, SoloSharedPayoff
from mistk_rl.league.player import (
    PLAYER_TYPES,
    ActivePlayer,
    HistoricalPlayer,
    Job,
    MainPlayer,
    SoloActivePlayer,
)
from mistk_rl.league.ratings import Ratings

RECENT_JOBS = 100
JOB_LOG = "jobs.jsonl"  # every job's record, beside league.json (`save`)


@dataclass
class RunningJob:
    job_id: int
    job: Job


@dataclass
class LeagueManager:
    active: dict[str, ActivePlayer] = field(default_factory=dict)
    historical: dict[str, HistoricalPlayer] = field(default_factory=dict)
    payoff: BattleSharedPayoff = field(default_factory=BattleSharedPayoff)
    solo_payoff: SoloSharedPayoff = field(default_factory=SoloSharedPayoff)
    ratings: Ratings = field(default_factory=Ratings)
    max_active_player_job: int = 3
    seed: Optional[int] = None
    running: dict[int, RunningJob] = field(default_factory=dict)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_JOBS))
    snapshots_taken: int = 0
    jobs_launched: int = 0
    jobs_finished: int = 0
    jobs_failed: int = 0
    # what each player trained against since the league began (`opponent_kind`): "player
    # branch kind" -> [jobs, games, wins, draws, losses, moves]
    mix: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self._unsaved: list[dict[str, Any]] = []  # job records `save` has not logged yet

    def _record(self, entry: dict[str, Any]) -> None:
        self.recent.append(entry)
        self._unsaved.append(entry)

    # ---- the LeagueView the players read -------------------------------------------------
    @property
    def active_players(self) -> list[ActivePlayer]:
        return list(self.active.values())

    @property
    def historical_players(self) -> list[HistoricalPlayer]:
        return list(self.historical.values())

    # ---- set-up --------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        players: Iterable[dict[str, Any]],
        *,
        one_phase_step: int,
        max_active_player_job: int = 3,
        seed: Optional[int] = None,
        fixed: Sequence[str] = (),
    ) -> "LeagueManager":
        """A new league from player specs ``{type, id, category, checkpoint, ...}`` (type:
        main, main_exploiter, league_exploiter, or solo with SoloActivePlayer's settings);
        each main player is snapshotted at step 0. `fixed`: the ids of opponents played as
        they are (`HistoricalPlayer.fixed`), in the first main player's category."""
        league = cls(max_active_player_job=max_active_player_job, seed=seed)
        for spec in players:
            kind = PLAYER_TYPES[PLAYER_TYPES.validate(spec["type"])]
            extra = {
                k: v
                for k, v in spec.items()
                if k not in ("type", "id", "category", "checkpoint", "initial_checkpoint")
            }
            player = kind(
                spec["id"],
                spec.get("category", "default"),
                spec["checkpoint"],
                one_phase_step=one_phase_step,
                initial_checkpoint=spec.get("initial_checkpoint", spec["checkpoint"]),
                **extra,
            )
            league._add(player)
        battle = [p for p in league.active_players if not isinstance(p, SoloActivePlayer)]
        if battle and not any(isinstance(p, MainPlayer) for p in battle):
            raise ValueError("a league of players that battle needs at least one main player")
        for player in list(league.active_players):
            if isinstance(player, MainPlayer):
                league._add_snapshot(player, player.initial_checkpoint)
        if fixed:
            mains = [p for p in battle if isinstance(p, MainPlayer)]
            if not mains:
                raise ValueError("fixed opponents are for a league of players that battle")
            for name in fixed:
                league._add(HistoricalPlayer(name, mains[0].category, "", fixed=True))
        return league

    @property
    def fixed(self) -> list[str]:
        """The fixed opponents' ids (`HistoricalPlayer.fixed`)."""
        return [p.player_id for p in self.historical_players if p.fixed]

    def _add(self, player: ActivePlayer | HistoricalPlayer, like: Optional[str] = None) -> None:
        if player.player_id in self.active or player.player_id in self.historical:
            raise ValueError(f"player id {player.player_id!r} is taken")
        self.payoff.add_player(player.player_id)
        self.ratings.add_player(player.player_id, like=like)
        if isinstance(player, SoloActivePlayer):
            self.solo_payoff.add_player(player.player_id)
        if isinstance(player, HistoricalPlayer):
            self.historical[player.player_id] = player
        else:
            self.active[player.player_id] = player

    def _add_snapshot(self, player: ActivePlayer, checkpoint_path: str) -> HistoricalPlayer:
        snapshot = player.snapshot(self.snapshots_taken, checkpoint_path)
        self.snapshots_taken += 1
        self._add(snapshot, like=player.player_id)
        return snapshot

    # ---- jobs ----------------------------------------------------------------------------
    def jobs_running(self, player_id: str) -> int:
        return sum(r.job.launch_player == player_id for r in self.running.values())

    def launch_job(self, player_id: str) -> Optional[RunningJob]:
        """A job for `player_id` (its opponent chosen by its branches), holding one of its
        slots; None when all its slots are taken."""
        player = self.active[player_id]
        if self.jobs_running(player_id) >= self.max_active_player_job:
            return None
        running = RunningJob(self.jobs_launched, player.choose_opponent(self, self.rng))
        self.jobs_launched += 1
        self.running[running.job_id] = running
        return running

    def finish_job(
        self,
        job_id: int,
        results: list[Result],
        steps: int = 0,
        returns: Optional[list[float]] = None,
    ) -> None:
        """The job's games ended, `results` from the launching player's side; `steps`: the
        env steps its player took (towards its snapshots). A solo job (no opponent) gives
        its episodes' `returns` instead, recorded in `solo_payoff`."""
        running = self.running.pop(job_id)
        job = running.job
        if job.opponent:
            self.payoff.update(job.launch_player, job.opponent, results)
            if job.opponent != job.launch_player:
                for result in results:
                    self.ratings.update(job.launch_player, job.opponent, result)
            summary: dict[str, Any] = {r: results.count(r) for r in ("win", "draw", "loss")}
            key = f"{job.launch_player} {job.branch} {self.opponent_kind(job)}"
            counts = self.mix.setdefault(key, [0] * 6)
            for k, n in enumerate(
                (1, len(results), summary["win"], summary["draw"], summary["loss"], steps)
            ):
                counts[k] += n
        else:  # a solo job: against the env
            returns = [float(r) for r in returns or ()]
            summary = {
                "episodes": len(returns),
                "mean_return": (round(float(np.mean(returns)), 6) if returns else None),
            }
            if job.launch_player in self.solo_payoff.jobs:
                epsilon = job.settings.get("agents", {}).get(job.launch_player, {}).get("epsilon")
                self.solo_payoff.update(
                    job.launch_player,
                    {
                        "job_id": job_id,
                        **summary,
                        "steps": steps,
                        "epsilon": epsilon,
                        "at_step": self.active[job.launch_player].total_agent_step + steps,
                    },
                )
        self.active[job.launch_player].total_agent_step += steps
        self.jobs_finished += 1
        self._record(
            {
                **asdict(job),
                "job_id": job_id,
                "results": summary,
                "steps": steps,
                "at_step": self.active[job.launch_player].total_agent_step,
            }
        )

    def opponent_kind(self, job: Job) -> str:
        """Who a job's opponent is to its player: ``itself``, another active player's id,
        ``snapshot of ID``, or ``fixed ID``."""
        if job.opponent == job.launch_player:
            return "itself"
        past = self.historical.get(job.opponent)
        if past is None:
            return job.opponent
        return f"fixed {past.player_id}" if past.fixed else f"snapshot of {past.parent_id}"

    def mix_rows(self) -> list[dict[str, Any]]:
        """`mix` as rows, each with its share of its player's moves (GET /league's
        jobs.mix): who each player trained against, in which branch, with what result."""
        moves: dict[str, int] = {}
        for key, counts in self.mix.items():
            player = key.split(" ", 1)[0]
            moves[player] = moves.get(player, 0) + counts[5]
        rows = []
        for key, (jobs, games, wins, draws, losses, steps) in sorted(self.mix.items()):
            player, branch, opponent = key.split(" ", 2)
            rows.append(
                {
                    "player": player,
                    "branch": branch,
                    "opponent": opponent,
                    "jobs": jobs,
                    "games": games,
                    "win": wins,
                    "draw": draws,
                    "loss": losses,
                    "score": round((wins + draws / 2) / games, 4) if games else None,
                    "moves": steps,
                    "share": round(steps / moves[player], 4) if moves[player] else None,
                }
            )
        return rows

    def fail_job(
        self, job_id: int, reason: str = "", details: Optional[dict[str, Any]] = None
    ) -> None:
        """The job did not launch, failed or timed out: its slot is free again, nothing
        recorded but the failure (with `details`, e.g. what was done about it)."""
        running = self.running.pop(job_id, None)
        if running is not None:
            self.jobs_failed += 1
            self._record(
                {**asdict(running.job), "job_id": job_id, "failed": reason, **(details or {})}
            )

    # ---- snapshots -----------------------------------------------------------------------
    def snapshot_due(self, player_id: str) -> bool:
        return self.active[player_id].is_trained_enough(self)

    def next_snapshot_id(self, player_id: str) -> str:
        """The id `take_snapshot` will give this player's snapshot now (to name its file)."""
        return self.active[player_id].snapshot_id(self.snapshots_taken)

    def take_snapshot(self, player_id: str, checkpoint_path: str) -> tuple[HistoricalPlayer, bool]:
        """Add the snapshot saved at `checkpoint_path`; returns it and whether the player
        resets to its initial weights now (the caller reloads them into its agent)."""
        player = self.active[player_id]
        snapshot = self._add_snapshot(player, checkpoint_path)
        player.mark_snapshot()
        reset = player.reset_on_snapshot(self.rng)
        if reset and getattr(player, "forget_on_reset", False):
            self.payoff.forget(player_id)
        return snapshot, reset

    # ---- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "active": [{"type": p.kind, **asdict(p)} for p in self.active_players],
            "historical": [asdict(p) for p in self.historical_players],
            "payoff": self.payoff.state_dict(),
            "ratings": self.ratings.state_dict(),
            "solo_payoff": self.solo_payoff.state_dict(),
            "max_active_player_job": self.max_active_player_job,
            "seed": self.seed,
            "running": [{"job_id": r.job_id, **asdict(r.job)} for r in self.running.values()],
            "recent": list(self.recent),
            "snapshots_taken": self.snapshots_taken,
            "jobs_launched": self.jobs_launched,
            "jobs_finished": self.jobs_finished,
            "jobs_failed": self.jobs_failed,
            "mix": self.mix,
            "rng": self.rng.bit_generator.state,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LeagueManager":
        league = cls(
            max_active_player_job=state["max_active_player_job"],
            seed=state["seed"],
            snapshots_taken=state["snapshots_taken"],
            jobs_launched=state["jobs_launched"],
            # (league.json files from before these counts: none)
            jobs_finished=state.get("jobs_finished", 0),
            jobs_failed=state.get("jobs_failed", 0),
            mix=state.get("mix", {}),  # (from before it: what was played is not known)
        )
        league.payoff.load_state_dict(state["payoff"])
        if "solo_payoff" in state:  # (league.json files from before solo leagues: none)
            league.solo_payoff.load_state_dict(state["solo_payoff"])
        league.ratings = Ratings.from_state(state["ratings"])
        for spec in state["active"]:
            spec = dict(spec)
            player = PLAYER_TYPES[spec.pop("type")](**spec)
            league.active[player.player_id] = player
            if (
                isinstance(player, SoloActivePlayer)
                and player.player_id not in league.solo_payoff.jobs
            ):
                league.solo_payoff.add_player(player.player_id)
        for spec in state["historical"]:
            league.historical[spec["player_id"]] = HistoricalPlayer(**spec)
        league.recent.extend(state["recent"])
        for r in state["running"]:  # whatever ran them stopped with the league: slots free
            league._record({**r, "failed": "the league restarted"})
            league.jobs_failed += 1
        league.rng.bit_generator.state = state["rng"]
        return league

    def save(self, path: Path) -> None:
        """The state to `path` (atomically), and the job records since the last save
        appended to ``jobs.jsonl`` beside it."""
        atomic_write_json(path, self.state_dict())
        if self._unsaved:
            with open(Path(path).with_name(JOB_LOG), "a") as log:
                log.writelines(json.dumps(entry) + "\n" for entry in self._unsaved)
            self._unsaved.clear()

    @classmethod
    def load(cls, path: Path) -> "LeagueManager":
        return cls.from_state(json.loads(Path(path).read_text()))

    def view(self, recent: int = 20) -> dict[str, Any]:
        """What GET /league shows: the table, the payoff matrix (row against column: win
        rate, draws half, and raw games; and `solo`: each solo player's last jobs), the
        jobs running and the last `recent`."""
        ids = [p.player_id for p in itertools.chain(self.active_players, self.historical_players)]
        payoff: dict[str, Any] = {
            "ids": ids,
            "winRate": self.payoff.matrix(ids).round(4).tolist(),
            "games": [[self.payoff.played(a, b) for b in ids] for a in ids],
        }
        if self.solo_payoff.jobs:
            payoff["solo"] = {p: list(jobs)[-recent:] for p, jobs in self.solo_payoff.jobs.items()}
        return {
            "players": self.table(),
            "payoff": payoff,
            "jobs": {
                "launched": self.jobs_launched,
                "finished": self.jobs_finished,
                "failed": self.jobs_failed,
                "running": [{"job_id": r.job_id, **asdict(r.job)} for r in self.running.values()],
                "recent": list(self.recent)[-recent:],
                "mix": self.mix_rows(),
            },
        }

    def table(self) -> list[dict[str, Any]]:
        """One row per player: kind, steps, parent, ratings (a solo player: its epsilon and
        its last job's mean return too); best first (TrueSkill exposure)."""
        rows = []
        for player in itertools.chain(self.active_players, self.historical_players):
            kind = "FixedOpponent" if getattr(player, "fixed", False) else type(player).__name__
            row = {
                "id": player.player_id,
                "kind": kind,
                "steps": player.total_agent_step,
                "parent": getattr(player, "parent_id", None),
                "exposure": self.ratings.exposure(player.player_id),
                "elo": self.ratings.elo[player.player_id],
            }
            if isinstance(player, SoloActivePlayer):  # its exploration, its last job's return
                jobs: Sequence[dict[str, Any]] = self.solo_payoff.jobs.get(player.player_id) or [{}]
                row["epsilon"] = round(player.epsilon(), 6) if player.eps_decay else None
                row["mean_return"] = jobs[-1].get("mean_return")
            rows.append(row)
        return sorted(rows, key=lambda row: -row["exposure"])
