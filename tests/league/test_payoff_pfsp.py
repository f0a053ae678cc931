"""League payoff (decay, win rates, the prior, orientation) and PFSP (weightings, guards)
against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from mistk_rl.league.payoff import BattleSharedPayoff, SoloSharedPayoff
from mistk_rl.league.pfsp import NoCandidates, pfsp, pfsp_probabilities, remove_monotonic_suffix


def _payoff(*players: str, **kw) -> BattleSharedPayoff:
    payoff = BattleSharedPayoff(**kw)
    for player in players:
        payoff.add_player(player)
    return payoff


def test_decay_applies_to_all_counts_before_each_game():
    payoff = _payoff("a", "b", min_games=0)
    payoff.update("a", "b", ["win", "loss", "draw"])
    (record,) = payoff.records.values()
    assert record.wins == pytest.approx(0.9801) and record.losses == pytest.approx(0.99)
    assert record.draws == pytest.approx(1.0) and record.games == pytest.approx(2.9701)
    assert payoff.win_rate("a", "b") == pytest.approx((0.9801 + 0.5) / 2.9701)  # .498333
    assert payoff.win_rate("b", "a") == pytest.approx((0.99 + 0.5) / 2.9701)


def test_ten_wins_then_ten_losses():
    payoff = _payoff("a", "b")
    payoff.update("a", "b", ["win"] * 10 + ["loss"] * 10)
    (record,) = payoff.records.values()
    assert (record.wins, record.losses, record.games) == pytest.approx(
        (8.647514, 9.561792, 18.209306), abs=1e-6
    )
    assert payoff.win_rate("a", "b") == pytest.approx(0.474895, abs=1e-6)


def test_prior_until_eight_raw_games_and_orientation():
    payoff = _payoff("b", "a")  # "b" registered first: the record is kept from "a"'s side
    payoff.update("b", "a", ["win"] * 7)
    assert payoff.win_rate("b", "a") == 0.5 == payoff.win_rate("a", "b")
    payoff.update("b", "a", ["win"])
    assert payoff.win_rate("b", "a") == 1.0 and payoff.win_rate("a", "b") == 0.0
    payoff.update("a", "b", ["win"] * 5 + ["draw"] * 3)
    assert payoff.win_rate("a", "b") + payoff.win_rate("b", "a") == pytest.approx(1.0)


def test_self_play_is_not_recorded_and_bad_input_changes_nothing():
    payoff = _payoff("a", "b")
    assert payoff.update("a", "a", ["win"] * 20) is False and not payoff.records
    assert payoff.win_rate("a", "a") == 0.5
    with pytest.raises(ValueError, match="not in the payoff"):
        payoff.update("a", "ghost", ["win"])
    with pytest.raises(ValueError, match="win, draw or loss"):
        payoff.update("a", "b", ["win", "wins"])
    assert not payoff.records


def test_payoff_state_round_trip():
    payoff = _payoff("a", "b", "c")
    payoff.update("a", "b", ["win"] * 9)
    payoff.update("c", "a", ["draw", "loss"] * 5)
    again = BattleSharedPayoff()
    again.load_state_dict(payoff.state_dict())
    np.testing.assert_array_equal(again.matrix(), payoff.matrix())
    assert again.matrix().shape == (3, 3) and again.matrix()[0, 1] == 1.0
    solo = SoloSharedPayoff(buffer_size=2)
    solo.add_player("s")
    for i in range(3):
        solo.update("s", {"return": i})
    assert [j["return"] for j in solo.jobs["s"]] == [1, 2]
    copy = SoloSharedPayoff()
    copy.load_state_dict(solo.state_dict())
    assert list(copy.jobs["s"]) == list(solo.jobs["s"]) and copy.jobs["s"].maxlen == 2


def test_pfsp_weightings():
    rates = [0.2, 0.5, 0.9]
    np.testing.assert_allclose(
        pfsp_probabilities(rates, "squared"), np.array([0.64, 0.25, 0.01]) / 0.90
    )
    np.testing.assert_allclose(
        pfsp_probabilities(rates, "variance"), np.array([0.16, 0.25, 0.09]) / 0.50
    )
    np.testing.assert_allclose(pfsp_probabilities(rates, "linear"), np.array([0.8, 0.5, 0.1]) / 1.4)
    np.testing.assert_allclose(
        pfsp_probabilities(rates, "linear_capped"), np.array([0.5, 0.5, 0.1]) / 1.1
    )


def test_pfsp_guards():
    # beating everyone under squared, or only 0s and 1s under variance: no weight at all
    np.testing.assert_allclose(pfsp_probabilities([1.0, 1.0, 1.0], "squared"), [1 / 3] * 3)
    np.testing.assert_allclose(pfsp_probabilities([0.0, 1.0], "variance"), [0.5, 0.5])
    with pytest.raises(NoCandidates):
        pfsp_probabilities([], "squared")
    with pytest.raises(ValueError, match="not one of"):
        pfsp_probabilities([0.5], "cubic")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pfsp_probabilities([1.5], "squared")


def test_pfsp_draws_with_its_probabilities():
    rng = np.random.default_rng(0)
    rates = [0.1, 0.6, 0.95]
    expected = pfsp_probabilities(rates, "squared")
    draws = [pfsp(["x", "y", "z"], rates, rng) for _ in range(20_000)]
    seen = np.array([draws.count(c) for c in "xyz"]) / len(draws)
    # within 4 standard errors of each probability
    assert np.all(np.abs(seen - expected) < 4 * np.sqrt(expected * (1 - expected) / 20_000))


def test_remove_monotonic_suffix():
    assert remove_monotonic_suffix([0.5, 0.6, 0.4, 0.3], "abcd") == ([0.5, 0.6], ["a", "b"])
    assert remove_monotonic_suffix([0.6, 0.5, 0.4], "abc") == ([], [])
    assert remove_monotonic_suffix([0.3, 0.5], "ab") == ([0.3, 0.5], ["a", "b"])
    assert remove_monotonic_suffix([], []) == ([], [])
