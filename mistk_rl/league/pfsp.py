"""Prioritized fictitious self-play: pick an opponent with probability f(win rate) / sum f.

The weightings are AlphaStar's: `squared` (1 - w)^2 and `linear_capped` min(0.5, 1 - w) favour
opponents the player loses to; `variance` w (1 - w) favours even matches; `linear` 1 - w.
When the weights sum to almost nothing (a player that beats every candidate under `squared`)
the pick is uniform. The guard is on the sum of the weights, not of the win rates: DI-engine
guards the win rates and divides 0 by 0 when every rate is 1.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import numpy as np

T = TypeVar("T")

WEIGHTINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "squared": lambda w: (1.0 - w) ** 2,
    "variance": lambda w: w * (1.0 - w),
    "linear": lambda w: 1.0 - w,
    "linear_capped": lambda w: np.minimum(0.5, 1.0 - w),
}
MIN_WEIGHT_SUM = 1e-10


class NoCandidates(LookupError):
    """PFSP was asked to choose among no players."""


def pfsp_probabilities(
    win_rates: Sequence[float] | np.ndarray, weighting: str = "squared"
) -> np.ndarray:
    """The probability of each candidate, from the player's win rates against them."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r} is not one of {', '.join(WEIGHTINGS)}")
    rates = np.asarray(win_rates, dtype=np.float64).reshape(-1)
    if rates.size == 0:
        raise NoCandidates("PFSP needs at least one candidate")
    if not np.all((rates >= 0) & (rates <= 1)):
        raise ValueError(f"win rates must lie in [0, 1], got {rates.tolist()}")
    weights = WEIGHTINGS[weighting](rates)
    total = weights.sum()
    if total < MIN_WEIGHT_SUM:
        return np.full(rates.size, 1.0 / rates.size)
    return weights / total


def pfsp(
    candidates: Sequence[T],
    win_rates: Sequence[float] | np.ndarray,
    rng: np.random.Generator,
    weighting: str = "squared",
) -> T:
    """One candidate, drawn with `pfsp_probabilities`."""
    if len(candidates) != len(win_rates):
        raise ValueError(f"{len(candidates)} candidates but {len(win_rates)} win rates")
    probs = pfsp_probabilities(win_rates, weighting)
    return candidates[int(rng.choice(len(candidates), p=probs))]


def remove_monotonic_suffix(
    win_rates: Sequence[float], players: Sequence[T]
) -> tuple[list[float], list[T]]:
    """Drop the trailing run of snapshots (in creation order) that get ever harder to beat
    (AlphaStar's verification branch): keep up to the last i where wr[i-1] < wr[i]; nothing
    when the rates never rise."""
    rates = list(win_rates)
    for i in range(len(rates) - 1, 0, -1):
        if rates[i - 1] < rates[i]:
            return rates[: i + 1], list(players[: i + 1])
    return [], []
