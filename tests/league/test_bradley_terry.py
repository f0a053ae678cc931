"""The ladder's ratings (`mistk_rl.league.bradley_terry`): fitted to games drawn from known
ratings, they come back within their intervals."""

from __future__ import annotations

import numpy as np
import pytest

from mistk_rl.league.bradley_terry import PairRecord, fit, rate

TRUE = {"anchor": 0.0, "good": 200.0, "better": 450.0}
FIRST_SEAT = 120.0


def _games(per_cell: int, seed: int, draw: float = 0.2) -> list[PairRecord]:
    """`per_cell` games for every ordered pair, the first seat's expected score Elo's
    probability; a share `draw` of them drawn (at most what that probability allows)."""
    rng = np.random.default_rng(seed)
    cells = []
    for first in TRUE:
        for second in TRUE:
            if first == second:
                continue
            p = 1 / (1 + 10 ** ((TRUE[second] - TRUE[first] - FIRST_SEAT) / 400))
            d = min(draw, 2 * min(p, 1 - p))
            win, drawn, loss = rng.multinomial(per_cell, [p - d / 2, d, 1 - p - d / 2])
            cells.append(PairRecord(first, second, int(win), int(drawn), int(loss)))
    return cells


def test_the_fit_finds_the_ratings_and_the_first_seat_the_games_came_from():
    cells = _games(4000, seed=0)
    got = fit(cells, list(TRUE), "anchor")
    assert got.ratings["anchor"] == 0.0
    for player, rating in TRUE.items():
        assert got.ratings[player] == pytest.approx(rating, abs=25)
    assert got.first_seat == pytest.approx(FIRST_SEAT, abs=20)


def test_intervals_cover_the_truth_and_narrow_with_more_games():
    few = rate(_games(100, seed=1), list(TRUE), "anchor", resamples=300)
    many = rate(_games(1600, seed=1), list(TRUE), "anchor", resamples=300)
    for player in ("good", "better"):
        for ladder in (few, many):
            rated = ladder.players[player]
            assert rated.low <= TRUE[player] <= rated.high, (player, rated)
            assert rated.low <= rated.rating <= rated.high
        width = {
            n: x.players[player].high - x.players[player].low
            for n, x in (("few", few), ("many", many))
        }
        assert width["many"] < width["few"] / 2  # (sixteen times the games: a quarter)
    assert many.first_seat_low <= FIRST_SEAT <= many.first_seat_high
    # the record: every game counted from the player's side
    anchor = many.players["anchor"]
    assert anchor.games == 4 * 1600 and 0 < anchor.score < 0.5


def test_an_undefeated_player_gets_a_finite_rating_and_a_bad_anchor_is_refused():
    cells = [
        PairRecord("strong", "weak", 50, 0, 0),
        PairRecord("weak", "strong", 0, 0, 50),
    ]
    got = fit(cells, ["weak", "strong"], "weak")
    assert 300 < got.ratings["strong"] < 2000  # (one virtual draw a cell: finite)
    with pytest.raises(ValueError, match="anchor 'nobody'"):
        fit(cells, ["weak", "strong"], "nobody")
    with pytest.raises(ValueError, match="no games"):
        fit([PairRecord("weak", "strong", 0, 0, 0)], ["weak", "strong"], "weak")
