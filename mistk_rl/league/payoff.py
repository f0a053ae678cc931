"""Payoff: how players fare against each other, as the win rates matchmaking reads.

`BattleSharedPayoff` keeps one `BattleRecord` per unordered pair of players, counted from
the side of the player whose id sorts first. Each game decays all four counts by `decay`
(0.99) before adding one, so old games fade and a player that improves is seen to. A win
rate counts draws as half a win; until a pair has played `min_games` games (raw count, 8)
it is the prior 0.5. Self-play games (a player against itself) are not recorded, and a
player's win rate against itself is 0.5.

`SoloSharedPayoff` keeps the last jobs of each solo player (single-agent training).

Both save and restore their state (`state_dict`), for a league that resumes after a restart.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Literal, Sequence

import numpy as np

Result = Literal["win", "draw", "loss"]
FLIPPED = {"win": "loss", "draw": "draw", "loss": "win"}


@dataclass
class BattleRecord:
    """Decayed counts, from the side of the pair's first id; `played` is the raw count."""

    wins: float = 0.0
    draws: float = 0.0
    losses: float = 0.0
    games: float = 0.0
    played: int = 0

    def add(self, result: Result, decay: float) -> None:
        self.wins, self.draws = self.wins * decay, self.draws * decay
        self.losses, self.games = self.losses * decay, self.games * decay
        self.games += 1.0
        self.played += 1
        if result == "win":
            self.wins += 1.0
        elif result == "draw":
            self.draws += 1.0
        else:
            self.losses += 1.0


class BattleRecordDict(dict):
    """Unordered pair of player ids -> BattleRecord (key: the ids sorted, joined by '|')."""

    @staticmethod
    def key(a: str, b: str) -> tuple[str, bool]:
        """The pair's key, and whether `a` is its second id (the record's counts are then
        from `b`'s side)."""
        first, second = sorted((a, b))
        return f"{first}|{second}", a != first


class BattleSharedPayoff:
    def __init__(self, decay: float = 0.99, min_games: int = 8, prior: float = 0.5) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay, self.min_games, self.prior = decay, min_games, prior
        self.players: list[str] = []
        self.records = BattleRecordDict()
        self._lock = threading.Lock()

    def add_player(self, player_id: str) -> None:
        with self._lock:
            if player_id in self.players:
                raise ValueError(f"player {player_id!r} is in the payoff already")
            self.players.append(player_id)

    def update(self, home: str, away: str, results: Iterable[Result]) -> bool:
        """Record games of `home` against `away`, each result from home's side; returns
        False (recording nothing) for self-play. An unknown player or result is a
        ValueError, raised before anything is recorded."""
        results = list(results)
        unknown = [p for p in (home, away) if p not in self.players]
        if unknown:
            raise ValueError(f"players {unknown} are not in the payoff")
        bad = [r for r in results if r not in FLIPPED]
        if bad:
            raise ValueError(f"results must be win, draw or loss, not {bad}")
        if home == away:
            return False
        key, flipped = BattleRecordDict.key(home, away)
        with self._lock:
            record = self.records.setdefault(key, BattleRecord())
            for result in results:
                record.add(FLIPPED[result] if flipped else result, self.decay)
        return True

    def win_rate(self, home: str, away: str) -> float:
        """home's win rate against away, draws counting half; the prior before min_games."""
        if home == away:
            return 0.5
        key, flipped = BattleRecordDict.key(home, away)
        with self._lock:
            record = self.records.get(key)
            if record is None or record.played < self.min_games:
                return self.prior
            wins = record.losses if flipped else record.wins
            return (wins + 0.5 * record.draws) / record.games

    def forget(self, player_id: str) -> int:
        """Drop every record of `player_id` (a player reset to new weights is another
        policy: what its former self won says nothing of it); returns how many."""
        with self._lock:
            mine = [k for k in self.records if player_id in k.split("|")]
            for key in mine:
                del self.records[key]
        return len(mine)

    def played(self, home: str, away: str) -> int:
        """Games recorded between the two (raw count, not decayed)."""
        with self._lock:
            record = self.records.get(BattleRecordDict.key(home, away)[0])
            return 0 if record is None or home == away else record.played

    def win_rates(self, home: str, aways: Sequence[str]) -> np.ndarray:
        return np.array([self.win_rate(home, away) for away in aways], dtype=np.float64)

    def matrix(self, players: Sequence[str] | None = None) -> np.ndarray:
        """win_rate(row, column) for `players` (default: all), e.g. for a heatmap."""
        players = list(players if players is not None else self.players)
        return np.array([self.win_rates(p, players) for p in players])

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "decay": self.decay,
                "min_games": self.min_games,
                "prior": self.prior,
                "players": list(self.players),
                "records": {k: asdict(r) for k, r in self.records.items()},
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.decay, self.min_games = state["decay"], state["min_games"]
            self.prior = state["prior"]
            self.players = list(state["players"])
            self.records = BattleRecordDict(
                {k: BattleRecord(**r) for k, r in state["records"].items()}
            )


class SoloSharedPayoff:
    """The last `buffer_size` job results of each solo (single-agent) player."""

    def __init__(self, buffer_size: int = 100) -> None:
        self.buffer_size = buffer_size
        self.jobs: dict[str, deque] = {}

    def add_player(self, player_id: str) -> None:
        if player_id in self.jobs:
            raise ValueError(f"player {player_id!r} is in the payoff already")
        self.jobs[player_id] = deque(maxlen=self.buffer_size)

    def update(self, player_id: str, job_result: dict[str, Any]) -> None:
        if player_id not in self.jobs:
            raise ValueError(f"player {player_id!r} is not in the payoff")
        self.jobs[player_id].append(job_result)

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffer_size": self.buffer_size,
            "jobs": {p: list(jobs) for p, jobs in self.jobs.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer_size = state["buffer_size"]
        self.jobs = {p: deque(jobs, maxlen=self.buffer_size) for p, jobs in state["jobs"].items()}
