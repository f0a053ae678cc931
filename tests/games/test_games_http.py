"""Games over HTTP: real agent services playing each other through a real GameOrchestrator."""

from __future__ import annotations

import pytest

from mistk_rl.sdk.client import BadRequest

GAME = "orchestrators.game_orchestrator:GameOrchestrator"
DQN = "agents.dqn_agent:DQNAgent"
RANDOM = "agents.opponent_agents:MaskedRandomAgent"
PERFECT = "agents.opponent_agents:TicTacToePerfectAgent"
SMALL_DQN = {
    "seed": 0,
    "policy": {"model": {"hidden_sizes": [32]}},
    "train": {"learning_starts": 50, "train_freq": 16, "gradient_steps": 4},
}


def _agent(launch, target, hparams):
    service = launch("agent", target)
    client = service.client()
    client.initialize(hyperparameters=hparams)
    client.build_model()
    return service, client


def test_two_agent_services_play_tictactoe(launch):
    orch = launch("orchestrator", GAME).client()
    orch.initialize({"id": "classic/tictactoe-v3"}, agents_needed=2)
    learner_service, learner = _agent(launch, DQN, SMALL_DQN)
    random_service, _ = _agent(launch, RANDOM, {"seed": 1})
    before = orch.status().resource_version
    with pytest.raises(BadRequest, match="player_1, player_2"):
        orch.register_agent("learner", learner_service.url, seats=["player_0"])
    assert orch.status().resource_version == before  # the refusal changed nothing
    orch.register_agent("learner", learner_service.url, seats=["player_2"])
    orch.register_agent("random", random_service.url)  # the seat left: player_1
    orch.start_episode(
        {"numEpisodes": 40, "numEnvs": 8, "seed": 0, "seatAssignment": "alternate"},
        wait=True,
        timeout=120,
    )
    results = orch.get_results()
    assert len(results.episodes) == 40
    seats = [e.seats for e in results.episodes]
    assert {s["player_1"] for s in seats} == {"learner", "random"}  # alternated
    totals = results.totals
    games = sum(t["games"] for t in totals["learner"].values())
    assert games == 40 and sum(t["illegal"] for a in totals.values() for t in a.values()) == 0
    for episode in results.episodes:  # one result per game, seen from both seats
        returns = episode.returns
        assert returns["player_1"] == -returns["player_2"]
    status = learner.status().payload  # the learner got transitions for all its moves
    moves = orch.status().payload["agentSteps"]["learner"]
    assert status["envSteps"] == moves > 0
    orch.reset()


def test_exhaustive_evaluation_over_http(launch):
    orch = launch("orchestrator", GAME).client()
    orch.initialize({"id": "tictactoe_v3"})
    service, agent = _agent(launch, PERFECT, {"seed": 0})
    orch.register_agent("perfect", service.url)
    with pytest.raises(BadRequest, match="not registered"):
        orch.start_episode({"exhaustive": {"agent": "nobody", "opponent": "random"}})
    orch.start_episode(
        {"exhaustive": {"agent": "perfect", "opponent": "random"}}, wait=True, timeout=120
    )
    (report,) = orch.get_results().evaluations
    assert report["complete"] and report["opponent"] == "random"
    first, second = report["seats"]["player_1"], report["seats"]["player_2"]
    assert first["lostLines"] == second["lostLines"] == 0  # against every reply
    assert first["lines"] > 50 and second["lines"] > 300
    assert first["win"] + first["draw"] == pytest.approx(1.0)
    orch.reset()


def test_a_searcher_served_off_the_event_loop_beats_win_block_at_connect_four(launch):
    """Alpha-beta four plies deep, a SearchOpponentAgent, against the win-block player:
    every game won (it blocks every threat and sees two-move wins win-block cannot)."""
    orch = launch("orchestrator", GAME).client()
    orch.initialize({"id": "classic/connect_four-v3"}, agents_needed=2)
    searcher, _ = _agent(
        launch,
        "agents.opponent_agents:SearchOpponentAgent",
        {"opponent": "connect4_alphabeta4", "seed": 0},
    )
    winblock, _ = _agent(launch, "agents.opponent_agents:ConnectFourWinBlockAgent", {"seed": 1})
    orch.register_agent("searcher", searcher.url)
    orch.register_agent("winblock", winblock.url)
    orch.start_episode(
        {"numEpisodes": 16, "numEnvs": 8, "seed": 0, "seatAssignment": "alternate"},
        wait=True,
        timeout=180,
    )
    totals = orch.get_results().totals["searcher"]
    assert sum(t["games"] for t in totals.values()) == 16 and len(totals) == 2  # both seats
    assert sum(t["win"] for t in totals.values()) >= 15
    assert sum(t["illegal"] for t in totals.values()) == 0
    orch.reset()
