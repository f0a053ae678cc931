"""Ratings: TrueSkill through the league's own environment, and Elo by hand."""

from __future__ import annotations

import pytest
import trueskill

from mistk_rl.league.ratings import Ratings


def test_trueskill_uses_the_league_env_not_the_global_one():
    ratings = Ratings(mu=0.0, sigma=3.0, beta=1.5, tau=0.0, draw_probability=0.2)
    ratings.add_player("a")
    ratings.add_player("b")
    ratings.update("a", "b", "win")
    env = trueskill.TrueSkill(mu=0.0, sigma=3.0, beta=1.5, tau=0.0, draw_probability=0.2)
    a, b = trueskill.rate_1vs1(env.create_rating(), env.create_rating(), env=env)
    assert ratings.trueskill["a"] == pytest.approx((a.mu, a.sigma))
    assert ratings.trueskill["b"] == pytest.approx((b.mu, b.sigma))
    assert ratings.exposure("a") == pytest.approx(env.expose(a))
    ratings.update("a", "b", "loss")  # a loss is b's win
    assert ratings.trueskill["a"][0] < a.mu


def test_elo_by_hand_and_snapshots_start_like_their_parent():
    ratings = Ratings()
    for p in ("a", "b"):
        ratings.add_player(p)
    ratings.update("a", "b", "win")  # equal ratings: expected 0.5, change 16
    assert ratings.elo == {"a": 1216.0, "b": 1184.0}
    ratings.update("a", "b", "draw")
    expected = 1 / (1 + 10 ** ((1184 - 1216) / 400))
    assert ratings.elo["a"] == pytest.approx(1216 + 32 * (0.5 - expected))
    ratings.add_player("a_snap", like="a")
    assert ratings.elo["a_snap"] == ratings.elo["a"]
    assert ratings.trueskill["a_snap"] == (ratings.trueskill["a"][0], ratings.sigma)
    with pytest.raises(ValueError, match="win, draw or loss"):
        ratings.update("a", "b", "won")
    again = Ratings.from_state(ratings.state_dict())
    assert again.table() == ratings.table()
