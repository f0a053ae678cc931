"""Ratings fitted to a round robin's games at once (Bradley-Terry), with intervals.

The league's own ratings (`mistk_rl.league.ratings`) move one game at a time and depend on
the order games came in; a ladder of finished players wants the ratings that make all its
games most likely, and how sure they are. The model: the player in the first seat, `i`,
scores against `j` with probability ``1 / (1 + 10^((R_j - R_i - H) / 400))``, Elo's scale,
with `H` the first seat's advantage (large in connect four), fitted with the ratings. A draw
counts half a win. One player, the anchor, is rated 0, so a rating is Elo points above it.

Each pair and seat order that was played also gets one virtual draw: a player that won
every game would otherwise be rated infinitely high (BayesElo's prior does the same). With
a hundred games a cell it moves a rating by a few points; an undefeated player's rating is
a lower bound, which its interval shows.

Intervals come from the bootstrap: each cell's games drawn again with replacement (as win,
draw, loss counts), the ratings fitted again, the 2.5th and 97.5th percentiles kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ELO = 400.0 / math.log(10.0)  # Elo points per unit of log-odds
VIRTUAL_DRAWS = 1  # per pair and seat order played (module doc)


@dataclass(frozen=True)
class PairRecord:
    """The games of `first` (in the first seat) against `second`, from first's side."""

    first: str
    second: str
    win: int
    draw: int
    loss: int

    @property
    def games(self) -> int:
        return self.win + self.draw + self.loss


@dataclass(frozen=True)
class Fit:
    """Elo points above the anchor per player, and the first seat's advantage."""

    ratings: dict[str, float]
    first_seat: float


def fit(cells: Sequence[PairRecord], players: Sequence[str], anchor: str) -> Fit:
    """The maximum-likelihood ratings (module doc) by Newton's method: the log-likelihood
    is concave, so it converges in a handful of steps from all zeros."""
    if anchor not in players:
        raise ValueError(f"the anchor {anchor!r} is not one of the players")
    index = {p: k for k, p in enumerate(p for p in players if p != anchor)}
    rows = [c for c in cells if c.games]
    if not rows:
        raise ValueError("no games to fit ratings to")
    design = np.zeros((len(rows), len(index) + 1))
    for r, cell in enumerate(rows):
        if cell.first in index:
            design[r, index[cell.first]] = 1.0
        if cell.second in index:
            design[r, index[cell.second]] = -1.0
        design[r, -1] = 1.0  # the first seat's advantage
    games = np.array([c.games + VIRTUAL_DRAWS for c in rows], dtype=float)
    scores = np.array([c.win + 0.5 * (c.draw + VIRTUAL_DRAWS) for c in rows])
    theta = np.zeros(design.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        gradient = design.T @ (scores - games * p)
        hessian = (design * (games * p * (1 - p))[:, None]).T @ design
        step = np.linalg.lstsq(hessian, gradient, rcond=None)[0]
        theta += step
        if np.max(np.abs(step)) < 1e-9:
            break
    ratings = {p: 0.0 if p == anchor else float(theta[index[p]] * ELO) for p in players}
    return Fit(ratings, float(theta[-1] * ELO))


@dataclass(frozen=True)
class Rated:
    """A player's rating with its bootstrap interval, and its record."""

    rating: float
    low: float
    high: float
    score: float  # points (win 1, draw 1/2) over its games
    games: int


@dataclass(frozen=True)
class LadderRatings:
    """Every player `Rated`, and the first seat's advantage with its interval."""

    players: dict[str, Rated]
    first_seat: float
    first_seat_low: float
    first_seat_high: float


def rate(
    cells: Sequence[PairRecord],
    players: Sequence[str],
    anchor: str,
    resamples: int = 500,
    seed: int = 0,
) -> LadderRatings:
    """The fit, with 95% bootstrap intervals from `resamples` refits (module doc), and each
    player's record."""
    best = fit(cells, players, anchor)
    rng = np.random.default_rng(seed)
    drawn: dict[str, list[float]] = {p: [] for p in players}
    first_seat: list[float] = []
    for _ in range(max(1, resamples)):
        again = [_redrawn(c, rng) for c in cells] if resamples else list(cells)
        refit = fit(again, players, anchor)
        for p in players:
            drawn[p].append(refit.ratings[p])
        first_seat.append(refit.first_seat)
    rated = {}
    for p in players:
        mine = [c for c in cells if p in (c.first, c.second)]
        points = sum((c.win if c.first == p else c.loss) + 0.5 * c.draw for c in mine)
        games = sum(c.games for c in mine)
        low, high = np.percentile(drawn[p], [2.5, 97.5])
        rated[p] = Rated(best.ratings[p], float(low), float(high), points / max(1, games), games)
    seat_low, seat_high = np.percentile(first_seat, [2.5, 97.5])
    return LadderRatings(rated, best.first_seat, float(seat_low), float(seat_high))


def _redrawn(cell: PairRecord, rng: np.random.Generator) -> PairRecord:
    """The cell's games drawn again with replacement (as counts)."""
    n = cell.games
    if not n:
        return cell
    win, draw, loss = rng.multinomial(n, [cell.win / n, cell.draw / n, cell.loss / n])
    return PairRecord(cell.first, cell.second, int(win), int(draw), int(loss))
