"""Ratings of league players: TrueSkill and Elo, updated one game at a time.

TrueSkill goes through an explicit `trueskill.TrueSkill` environment (its own mu, sigma,
beta, tau and draw probability; `rate_1vs1(..., env=)`, `env.expose`), never the module's
global defaults, which DI-engine ends up rating with. Elo: 1,200 to start, K = 32, expected score
1 / (1 + 10^((Rb - Ra) / 400)), kept as a float.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trueskill

RESULT_SCORE = {"win": 1.0, "draw": 0.5, "loss": 0.0}


@dataclass
class Ratings:
    mu: float = 25.0
    sigma: float = 25.0 / 3
    beta: float = 25.0 / 6
    tau: float = 25.0 / 300
    draw_probability: float = 0.1
    elo_initial: float = 1200.0
    elo_k: float = 32.0
    trueskill: dict[str, tuple[float, float]] = field(default_factory=dict)  # id -> (mu, sigma)
    elo: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = trueskill.TrueSkill(
            mu=self.mu,
            sigma=self.sigma,
            beta=self.beta,
            tau=self.tau,
            draw_probability=self.draw_probability,
        )

    def add_player(self, player_id: str, like: str | None = None) -> None:
        """A new player; `like`: start from that player's mu (a snapshot of it) with a fresh
        sigma, and its Elo."""
        mu = self.trueskill[like][0] if like in self.trueskill else self.mu
        self.trueskill[player_id] = (mu, self.sigma)
        self.elo[player_id] = self.elo.get(like, self.elo_initial) if like else self.elo_initial

    def update(self, home: str, away: str, result: str) -> None:
        """One game, `result` from home's side (win, draw, loss)."""
        if result not in RESULT_SCORE:
            raise ValueError(f"result must be win, draw or loss, not {result!r}")
        a, b = (self.env.create_rating(*self.trueskill[p]) for p in (home, away))
        if result == "loss":
            b, a = trueskill.rate_1vs1(b, a, env=self.env)
        else:
            a, b = trueskill.rate_1vs1(a, b, drawn=result == "draw", env=self.env)
        self.trueskill[home], self.trueskill[away] = (a.mu, a.sigma), (b.mu, b.sigma)
        expected = 1.0 / (1.0 + 10 ** ((self.elo[away] - self.elo[home]) / 400))
        change = self.elo_k * (RESULT_SCORE[result] - expected)
        self.elo[home] += change
        self.elo[away] -= change

    def exposure(self, player_id: str) -> float:
        """TrueSkill's conservative estimate (mu - k sigma in this env), for rankings."""
        return float(self.env.expose(self.env.create_rating(*self.trueskill[player_id])))

    def table(self) -> dict[str, dict[str, float]]:
        return {
            p: {"mu": mu, "sigma": sigma, "exposure": self.exposure(p), "elo": self.elo[p]}
            for p, (mu, sigma) in self.trueskill.items()
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("mu", "sigma", "beta", "tau", "draw_probability", "elo_initial", "elo_k")
        } | {"trueskill": {p: list(v) for p, v in self.trueskill.items()}, "elo": dict(self.elo)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Ratings":
        ratings = cls(**{k: v for k, v in state.items() if k not in ("trueskill", "elo")})
        ratings.trueskill = {p: (float(v[0]), float(v[1])) for p, v in state["trueskill"].items()}
        ratings.elo = dict(state["elo"])
        return ratings
