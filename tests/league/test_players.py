"""League players: branch frequencies, the opponents each branch picks, snapshot rules,
snapshot ids and who resets."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest

from mistk_rl.league.payoff import BattleSharedPayoff
from mistk_rl.league.pfsp import NoCandidates
from mistk_rl.league.player import (
    ActivePlayer,
    HistoricalPlayer,
    LeagueExploiter,
    MainExploiter,
    MainPlayer,
)


@dataclass
class League:
    payoff: BattleSharedPayoff = field(default_factory=BattleSharedPayoff)
    historical_players: list = field(default_factory=list)
    active_players: list = field(default_factory=list)

    def add(self, player) -> None:
        self.payoff.add_player(player.player_id)
        (
            self.historical_players if isinstance(player, HistoricalPlayer) else self.active_players
        ).append(player)


def _league() -> tuple[League, MainPlayer, MainExploiter, LeagueExploiter]:
    league = League()
    main = MainPlayer("main", "ttt", "main.pt", one_phase_step=100)
    exploiter = MainExploiter("me", "ttt", "me.pt", one_phase_step=100)
    league_exploiter = LeagueExploiter("le", "ttt", "le.pt", one_phase_step=100)
    for player in (main, exploiter, league_exploiter):
        league.add(player)
    for sequence, player in enumerate((main, exploiter)):  # the league's seed snapshots
        league.add(player.snapshot(sequence, f"{player.player_id}-0.pt"))
    return league, main, exploiter, league_exploiter


def _frequencies(player: ActivePlayer, league: League, n: int = 8000) -> tuple[Counter, Counter]:
    rng = np.random.default_rng(0)
    jobs = [player.choose_opponent(league, rng) for _ in range(n)]
    return Counter(j.branch for j in jobs), Counter(j.opponent for j in jobs)


def _close(count: int, n: int, p: float) -> bool:
    return abs(count / n - p) < 4 * np.sqrt(p * (1 - p) / n)


def test_main_player_branches_at_their_frequencies():
    league, main, *_ = _league()
    # the main player loses to the main exploiter's snapshot: verification has work to do
    league.payoff.update("main", "me_0_1", ["loss"] * 10)
    branches, opponents = _frequencies(main, league)
    assert _close(branches["pfsp"], 8000, 0.5)
    assert _close(branches["sp"], 8000, 0.35)
    assert _close(branches["verification"], 8000, 0.15)
    assert opponents["main"] == branches["sp"]  # self-play: its win rate vs itself is 0.5
    # pfsp (squared) prefers the snapshot it loses to: (1-0)^2 against (1-.5)^2
    pfsp_to_me = branches["verification"] + branches["pfsp"] * 0.8
    assert _close(opponents["me_0_1"], 8000, pfsp_to_me / 8000)


def test_the_fixed_branch_keeps_the_fixed_opponents_share_among_many_snapshots():
    league, _, _, league_exploiter = _league()
    main = MainPlayer("m2", "ttt", "m2.pt", branches={"pfsp": 0.5, "fixed": 0.5})
    league.add(main)
    for k in range(20):  # twenty snapshots it is even with
        league.add(HistoricalPlayer(f"m2_{k}", "ttt", f"{k}.pt", parent_id="m2"))
    for name, losses in (("random", 0), ("winblock", 6)):
        league.add(HistoricalPlayer(name, "ttt", "", fixed=True))
        league.payoff.update("m2", name, ["loss"] * losses + ["win"] * (10 - losses))
    branches, opponents = _frequencies(main, league)
    assert _close(branches["fixed"], 8000, 0.5)
    # PFSP (squared) among the fixed opponents alone: win-block (1-.4)^2, random (1-1)^2
    fixed = opponents["winblock"] + opponents["random"]
    assert fixed >= branches["fixed"] and opponents["random"] == 0
    # (pfsp over all 24 historical players would give win-block .36 / 5.86 of its jobs)
    assert opponents["winblock"] > 0.5 * 8000 * 0.95
    # a league without fixed opponents: the branch is pfsp over every historical player
    lone = MainPlayer("lone", "ttt", "lone.pt", branches={"fixed": 1.0})
    plain = League()
    plain.add(lone)
    plain.add(lone.snapshot(0, "lone-0.pt"))
    _, met = _frequencies(lone, plain, n=50)
    assert met == Counter({"lone_0_0": 50})
    assert "fixed" in league_exploiter.available_branches()


def test_verification_falls_through_to_self_play():
    league, main, *_ = _league()  # nothing to verify: every rate is the prior 0.5
    branches, _ = _frequencies(main, league)
    assert branches["verification"] == 0
    assert _close(branches["sp"], 8000, 0.5) and _close(branches["pfsp"], 8000, 0.5)


def test_self_play_against_a_strong_main_uses_its_snapshots():
    league, main, *_ = _league()
    rival = MainPlayer("rival", "ttt", "rival.pt")
    league.add(rival)
    league.add(rival.snapshot(2, "rival-0.pt"))
    league.payoff.update("main", "rival", ["loss"] * 10)  # main wins 0 < 1 - 0.7
    rng = np.random.default_rng(1)
    picks = {main._self_play(rival, league, rng).opponent for _ in range(50)}
    assert picks == {"rival_0_2"}


def test_main_exploiter_and_league_exploiter_opponents():
    league, main, exploiter, league_exploiter = _league()
    _, opponents = _frequencies(exploiter, league, 500)
    assert set(opponents) == {"main"}  # above 0.1 against it (the prior)
    league.payoff.update("me", "main", ["loss"] * 10)
    _, opponents = _frequencies(exploiter, league, 500)
    assert set(opponents) == {"main_0_0"}  # too weak: the main player's snapshots
    league.payoff.update("le", "main_0_0", ["win"] * 10)  # linear_capped: 0 against .5
    league.payoff.update("le", "me_0_1", ["loss"] * 10)
    _, opponents = _frequencies(league_exploiter, league, 2000)
    assert set(opponents) == {"me_0_1"}


def test_snapshot_rule_at_one_and_two_phases():
    league, main, exploiter, _ = _league()
    main.total_agent_step = 99
    assert not main.is_trained_enough(league)
    main.total_agent_step = 100  # one phase: needs > 0.7 against every historical player
    assert not main.is_trained_enough(league)  # priors: 0.5
    league.payoff.update("main", "main_0_0", ["win"] * 10)
    assert not main.is_trained_enough(league)  # still 0.5 against me_0_1
    league.payoff.update("main", "me_0_1", ["win"] * 9 + ["loss"])
    assert main.is_trained_enough(league) and main.is_trained_enough(league)  # pure
    main.mark_snapshot()
    main.total_agent_step = 150
    assert not main.is_trained_enough(league)
    main.total_agent_step = 300  # two phases since the mark: whatever the win rates
    league.payoff.update("main", "me_0_1", ["loss"] * 30)
    assert main.is_trained_enough(league)
    # the main exploiter is judged against the active main players only
    exploiter.total_agent_step = 100
    assert not exploiter.is_trained_enough(league)
    league.payoff.update("me", "main", ["win"] * 10)
    assert exploiter.is_trained_enough(league)


def test_snapshot_ids_and_resets():
    _, main, exploiter, league_exploiter = _league()
    a, b = main.snapshot(7, "a.pt"), main.snapshot(8, "b.pt")  # same step, different ids
    assert a.player_id != b.player_id and a.parent_id == b.parent_id == "main"
    assert a.total_agent_step == main.total_agent_step
    rng = np.random.default_rng(0)
    assert not any(main.reset_on_snapshot(rng) for _ in range(100))
    assert all(exploiter.reset_on_snapshot(rng) for _ in range(100))
    resets = sum(league_exploiter.reset_on_snapshot(rng) for _ in range(4000))
    assert _close(resets, 4000, 0.25)


def test_bad_branches_and_empty_candidates():
    with pytest.raises(ValueError, match="sum to 1"):
        MainPlayer("m", "ttt", "m.pt", branches={"pfsp": 0.5, "sp": 0.3})
    with pytest.raises(ValueError, match="no branch"):
        MainPlayer("m", "ttt", "m.pt", branches={"pfsp": 0.5, "fancy": 0.5})
    league = League()
    main = MainPlayer("m", "ttt", "m.pt")
    league.add(main)
    with pytest.raises(NoCandidates):
        main._pfsp_branch(league, np.random.default_rng(0))
