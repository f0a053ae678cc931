"""Intervals for figures over seeds and games, without scipy (not among the dependencies).

Learning claims here are distributions: a mean over seeds with its t interval, a difference
of two sides' means with Welch's, and a win rate over games with Wilson's score interval
(which, unlike the normal approximation, stays inside [0, 1] near 0 and 1).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def t_quantile(p: float, dof: float) -> float:
    """The p-quantile (p > .5) of Student's t with `dof` degrees of freedom: the pdf integrated
    by Simpson's rule, the quantile by bisection (no scipy among the dependencies)."""
    norm = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)

    def cdf(x: float, n: int = 2000) -> float:
        xs = np.linspace(0.0, x, n + 1)
        ys = norm * (1 + xs**2 / dof) ** (-(dof + 1) / 2)
        return 0.5 + (x / n / 3) * (ys[0] + ys[-1] + 4 * ys[1:-1:2].sum() + 2 * ys[2:-1:2].sum())

    low, high = 0.0, 1000.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def welch_interval(
    a: Sequence[float], b: Sequence[float], level: float = 0.95
) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its Welch t interval (unequal variances)."""
    xa, xb = np.asarray(a, float), np.asarray(b, float)
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    diff, se = xa.mean() - xb.mean(), math.sqrt(va + vb)
    if se == 0.0:
        return diff, diff, diff
    dof = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = t_quantile(0.5 + level / 2, dof) * se
    return diff, diff - half, diff + half


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """The mean of `values` (one a seed) and its t interval; one value: no interval."""
    x = np.asarray(values, float)
    mean = float(x.mean())
    if len(x) < 2 or x.std() == 0.0:
        return mean, mean, mean
    half = t_quantile(0.5 + level / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def wilson_interval(successes: float, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson's score interval of a rate (95% by default) from `trials` games."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = (
        z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    )
    return max(0.0, centre - half), min(1.0, centre + half)


def crossed_bootstrap(
    outcomes: np.ndarray, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """The mean score over a grid of pairings and its percentile interval, when the rows and
    the columns are both samples (seeds of two sides, every row against every column).

    `outcomes[i, j]` is (wins, draws, losses) of row i against column j. Each resample
    draws rows and columns with replacement, as a two-sided ("pigeonhole") bootstrap does,
    and each drawn cell's games from its own outcome frequencies, so the interval carries
    both sides' seed-to-seed spread and the games' noise. A score is (wins + draws / 2) /
    games; the figure is the mean of the cells' scores."""
    wdl = np.asarray(outcomes, float)
    games = wdl.sum(axis=-1)
    score = (wdl[..., 0] + wdl[..., 1] / 2) / games
    mean = float(score.mean())
    if resamples <= 0:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    n_rows, n_cols = score.shape
    freq = wdl / games[..., None]
    means = np.empty(resamples)
    for k in range(resamples):
        rows = rng.integers(n_rows, size=n_rows)
        cols = rng.integers(n_cols, size=n_cols)
        cells = np.ix_(rows, cols)
        n = games[cells].astype(int)
        drawn = np.array(
            [rng.multinomial(g, p) for g, p in zip(n.ravel(), freq[cells].reshape(-1, 3))]
        )
        means[k] = ((drawn[:, 0] + drawn[:, 1] / 2) / n.ravel()).mean()
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return mean, float(low), float(high)
