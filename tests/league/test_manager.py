"""The league manager: seeding, job slots, results, snapshots, and a save/load round trip
that makes the same matchmaking."""

from __future__ import annotations

import json

import pytest

from mistk_rl.league.manager import JOB_LOG, LeagueManager
from mistk_rl.league.player import MainExploiter

PLAYERS = [
    {"type": "main", "id": "main", "category": "ttt", "checkpoint": "main.pt"},
    {"type": "main_exploiter", "id": "me", "category": "ttt", "checkpoint": "me.pt"},
    {"type": "league_exploiter", "id": "le", "category": "ttt", "checkpoint": "le.pt"},
]


def _league(**kw) -> LeagueManager:
    return LeagueManager.create(PLAYERS, one_phase_step=100, seed=0, **kw)


def test_every_main_player_starts_with_a_snapshot():
    league = _league()
    (seed,) = league.historical_players
    assert seed.parent_id == "main" and seed.checkpoint_path == "main.pt"
    with pytest.raises(ValueError, match="main player"):
        LeagueManager.create(PLAYERS[1:], one_phase_step=100)
    with pytest.raises(ValueError, match="unknown league player type 'boss'"):
        LeagueManager.create([{**PLAYERS[0], "type": "boss"}], one_phase_step=100)


def test_job_slots_are_released_on_finish_and_on_failure():
    league = _league(max_active_player_job=2)
    first, second = league.launch_job("main"), league.launch_job("main")
    assert first and second and league.launch_job("main") is None  # both slots taken
    league.fail_job(first.job_id, "agent unreachable")
    third = league.launch_job("main")
    assert third is not None and league.launch_job("main") is None
    league.finish_job(second.job_id, ["win"], steps=9)
    assert league.jobs_running("main") == 1 and league.active["main"].total_agent_step == 9
    assert league.recent[0]["failed"] == "agent unreachable"


def test_finished_games_update_payoff_and_ratings():
    league = _league()
    job = league.launch_job("le")  # pfsp over the historical players: the main's seed snapshot
    assert job.job.opponent == "main_0_0"
    league.finish_job(job.job_id, ["win"] * 9)
    assert league.payoff.win_rate("le", "main_0_0") == 1.0
    assert league.ratings.elo["le"] > 1200 > league.ratings.elo["main_0_0"]
    assert league.table()[0]["id"] == "le"


def test_only_the_snapshotted_player_resets():
    league = _league()
    exploiter = league.active["me"]
    exploiter.total_agent_step = 250  # two phases: due whatever the win rates
    assert league.snapshot_due("me") and not league.snapshot_due("main")
    snapshot, reset = league.take_snapshot("me", "snap/me_250.pt")
    assert isinstance(exploiter, MainExploiter) and reset  # a main exploiter always resets
    assert snapshot.parent_id == "me" and snapshot.player_id in league.historical
    assert not league.snapshot_due("me")  # marked
    league.active["main"].total_agent_step = 250
    again, reset_main = league.take_snapshot("main", "snap/main_250.pt")
    assert not reset_main and again.player_id != snapshot.player_id


@pytest.mark.parametrize("forget", [False, True])
def test_a_reset_exploiter_forgets_its_records_only_when_told(forget):
    """A main exploiter that lost everything to the main player plays the main's
    snapshots; reset (at its snapshot), with forgetOnReset it is back on the prior and
    plays the main player again; without, AlphaStar's rule keeps it on the snapshots."""
    specs = [PLAYERS[0], {**PLAYERS[1], "forget_on_reset": forget}]
    league = LeagueManager.create(specs, one_phase_step=100, seed=0)
    job = league.launch_job("me")
    assert job.job.opponent == "main"  # (no record yet: the prior, .5 > .1)
    league.finish_job(job.job_id, ["loss"] * 20, steps=250)
    assert league.payoff.win_rate("me", "main") == 0.0
    job = league.launch_job("me")
    assert job.job.opponent == "main_0_0"  # under .1: the main's snapshots
    league.finish_job(job.job_id, ["win"] * 4, steps=10)
    league.payoff.update("main", "main_0_0", ["win"] * 9)  # a record without the exploiter
    _, reset = league.take_snapshot("me", "snap/me_260.pt")
    assert reset
    again = league.launch_job("me")
    assert (again.job.opponent == "main") is forget
    assert league.payoff.played("me", "main") == (0 if forget else 20)
    assert league.payoff.played("me", "main_0_0") == (0 if forget else 4)
    assert league.payoff.played("main", "main_0_0") == 9  # (others' records stay)


def test_save_and_load_give_the_same_matchmaking(tmp_path):
    league = _league()
    for _ in range(5):  # some history: games, a snapshot, a job left running
        job = league.launch_job("main")
        league.finish_job(job.job_id, ["win", "loss", "draw"], steps=40)
    league.take_snapshot("main", "snap/main_200.pt")
    left_running = league.launch_job("me")
    league.save(tmp_path / "league.json")
    loaded = LeagueManager.load(tmp_path / "league.json")
    assert loaded.jobs_running("me") == 0  # what ran it stopped with the league
    assert loaded.recent[-1]["job_id"] == left_running.job_id
    league.fail_job(left_running.job_id)
    assert loaded.payoff.state_dict() == league.payoff.state_dict()
    assert loaded.table() == league.table()

    def jobs(manager):
        out = []
        for player in ("main", "me", "le") * 10:
            running = manager.launch_job(player)
            out.append((running.job.opponent, running.job.branch))
            manager.finish_job(running.job_id, ["loss"], steps=1)
        return out

    assert jobs(loaded) == jobs(league)


def test_every_jobs_record_is_logged_once_across_saves_and_a_restart(tmp_path):
    """jobs.jsonl beside league.json: each finished or failed job once, in order, with the
    player's moves after it, however many saves; a restarted league's orphaned job too."""
    league = _league()
    state = tmp_path / "league.json"
    launched = [league.launch_job("main") for _ in range(3)]
    league.finish_job(launched[0].job_id, ["win", "loss"], steps=40)
    league.save(state)
    league.save(state)  # (nothing new: nothing appended)
    league.fail_job(launched[1].job_id, "agent unreachable")
    league.finish_job(launched[2].job_id, ["draw"], steps=25)
    league.save(state)
    left = league.launch_job("me")
    league.save(state)
    loaded = LeagueManager.load(state)  # `left` was running: it failed with the league
    loaded.save(state)
    records = [json.loads(line) for line in (tmp_path / JOB_LOG).read_text().splitlines()]
    ids = [r["job_id"] for r in records]
    assert ids == [launched[0].job_id, launched[1].job_id, launched[2].job_id, left.job_id]
    assert [r.get("at_step") for r in records] == [40, None, 65, None]
    assert records[0]["results"] == {"win": 1, "draw": 0, "loss": 1}
    assert records[0]["opponent"] == launched[0].job.opponent
    assert records[1]["failed"] == "agent unreachable"
    assert records[3]["failed"] == "the league restarted"


def test_the_mix_counts_who_each_player_trained_against_and_survives_a_restart(tmp_path):
    league = _league(fixed=["winblock"])
    played = []
    for player, results, steps in (("main", ["win", "loss"], 30), ("me", ["draw"], 10)) * 3:
        job = league.launch_job(player)
        played.append((player, job.job.branch, league.opponent_kind(job.job)))
        league.finish_job(job.job_id, results, steps=steps)
    rows = {(r["player"], r["branch"], r["opponent"]): r for r in league.view()["jobs"]["mix"]}
    assert sorted(rows) == sorted(set(played))
    for key, row in rows.items():
        jobs = played.count(key)
        per_job = 30 if key[0] == "main" else 10
        assert (row["jobs"], row["moves"]) == (jobs, jobs * per_job)
        assert row["score"] == 0.5 and row["games"] == jobs * (2 if key[0] == "main" else 1)
    for player in ("main", "me"):
        assert sum(r["share"] for k, r in rows.items() if k[0] == player) == pytest.approx(1)
    kinds = {k[2] for k in rows}
    assert kinds <= {"itself", "main", "snapshot of main", "fixed winblock"}
    league.save(tmp_path / "league.json")
    assert LeagueManager.load(tmp_path / "league.json").mix_rows() == league.mix_rows()


def test_pfsp_meets_the_fixed_opponent_it_loses_to_and_self_play_never_does(tmp_path):
    league = _league(fixed=["winblock"])
    wb = league.historical["winblock"]
    assert wb.fixed and wb.category == "ttt" and wb.checkpoint_path == "" == wb.parent_id
    (snapshot,) = [p for p in league.historical if p != "winblock"]
    league.payoff.update("main", "winblock", ["loss"] * 20)
    league.payoff.update("main", snapshot, ["win", "loss"] * 10)
    main = league.active["main"]
    pfsp = [main._pfsp_branch(league, league.rng).opponent for _ in range(2000)]
    share = pfsp.count("winblock") / len(pfsp)
    assert 0.72 < share < 0.88  # squared: weights 1 and .25, so .8
    others = [main._sp_branch(league, league.rng).opponent for _ in range(200)]
    others += [main._verification_branch(league, league.rng).opponent for _ in range(200)]
    assert "winblock" not in others and "winblock" not in [
        league.active["me"].choose_opponent(league, league.rng).opponent for _ in range(200)
    ]
    league.save(tmp_path / "league.json")
    again = LeagueManager.load(tmp_path / "league.json")
    assert again.fixed == ["winblock"]
    assert {row["id"]: row["kind"] for row in again.table()}["winblock"] == "FixedOpponent"
    with pytest.raises(ValueError, match="taken"):
        _league(fixed=["main"])


def test_metrics_rate_the_active_players_and_only_the_best_snapshots():
    """A league gains a snapshot every phase: /metrics shows every active player's ratings
    and those of the best `RATED_SNAPSHOTS` snapshots, so its series stay bounded."""
    from orchestrators.league_orchestrator import RATED_SNAPSHOTS, rated_players

    league = _league()
    for i in range(RATED_SNAPSHOTS + 4):
        league.take_snapshot("main", f"snap/main_{i}.pt")
    snapshots = [row for row in league.table() if row["id"] not in league.active]
    assert len(snapshots) == RATED_SNAPSHOTS + 5  # (with the seed snapshot)
    rated = rated_players(league)
    assert [row["id"] for row in rated[:3]] == [
        row["id"] for row in league.table() if row["id"] in league.active
    ]
    assert rated[3:] == snapshots[:RATED_SNAPSHOTS]  # the best, best first
