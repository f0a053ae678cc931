"""GameOrchestrator in-process, with scripted stand-ins for the agent clients: seats, the
transitions of turn-based and simultaneous games, results, illegal moves, enumeration."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.orchestrator import RegisteredAgent
from mistk_rl.games.opponents import MaskedRandom, TicTacToePerfect
from mistk_rl.sdk.schemas import AgentSettings, EpisodeConfig, ExhaustiveSpec
from mistk_rl.service.handlers import refuse_unknown_options
from orchestrators.game_orchestrator import GameOrchestrator

TICTACTOE, RPS = "classic/tictactoe-v3", "classic/rps-v2"


class ScriptedClient:
    """An agent client: lowest legal move by default, or a policy; records what it gets."""

    def __init__(self, policy=None) -> None:
        self.policy = policy or (lambda entity, obs, mask: int(np.flatnonzero(mask)[0]))
        self.transitions: dict[str, list[dict]] = defaultdict(list)  # entity -> in order
        self.asked: list[str] = []
        self.modes: list[str] = []

    def episode_started(self, obs, mode="collect", **_):
        self.modes.append(mode)

    def step(self, obs, replay=None, action_mask=None):
        if replay:
            self.replay_action(replay)
        return self.get_action(obs, action_mask)

    def get_action(self, obs, action_mask=None):
        self.asked += list(obs)
        return {
            e: self.policy(
                e, np.asarray(o), None if action_mask is None else np.asarray(action_mask[e])
            )
            for e, o in obs.items()
        }

    def replay_action(self, replay):
        for entity in replay["actions"]:
            self.transitions[entity].append(
                {field: values[entity] for field, values in replay.items()}
            )

    def episode_stopped(self):
        pass


def _orchestrator(
    env_id: str, clients: dict[str, tuple[ScriptedClient, tuple]], capabilities=frozenset({"step"})
) -> GameOrchestrator:
    orch = GameOrchestrator()
    orch.agents_needed = len(clients)
    orch.validate_initialize({"id": env_id}, len(clients))
    orch.do_initialize({"id": env_id, "kwargs": {}}, len(clients))
    for name, (client, seats) in clients.items():
        held = orch.validate_register_agent(name, seats)
        orch.agents[name] = RegisteredAgent(
            name, "http://127.0.0.1:1", False, client, capabilities, held
        )
    return orch


def test_seats_come_from_the_env_and_registration_checks_them():
    orch = _orchestrator(TICTACTOE, {})
    assert orch.seats == ["player_1", "player_2"]
    orch.agents_needed = 2
    with pytest.raises(InvalidRequest, match="player_1, player_2"):
        orch.validate_register_agent("a", ("player_0",))
    orch.agents["a"] = RegisteredAgent(
        "a", "u", False, ScriptedClient(), frozenset(), orch.validate_register_agent("a", ())
    )
    assert orch.agents["a"].seats == ("player_1",)  # the first free seat
    with pytest.raises(InvalidRequest, match="held by one agent"):
        orch.validate_register_agent("b", ("player_1",))
    assert orch.validate_register_agent("b", ()) == ("player_2",)
    orch.agents["b"] = RegisteredAgent(
        "b", "u", False, ScriptedClient(), frozenset(), ("player_2",)
    )
    assert orch.validate_register_agent("c", ()) == ()  # no seat left: on the bench
    solo = _orchestrator(TICTACTOE, {})
    solo.agents_needed = 1  # one agent: it must hold both seats
    with pytest.raises(InvalidRequest, match="no seat empty: player_2"):
        solo.validate_register_agent("y", ("player_1",))
    assert solo.validate_register_agent("y", ()) == ("player_1", "player_2")
    config = _orchestrator(TICTACTOE, {"me": (ScriptedClient(), ())}).agent_config(
        "me", ("player_1", "player_2")
    )
    assert config["observationSpace"]["shape"] == [3, 3, 2]  # the mask travels beside it
    assert config["actionSpace"] == {"type": "Discrete", "n": 9, "start": 0}
    assert config["properties"]["seats"] == ["player_1", "player_2"]


def test_unknown_game_is_refused():
    with pytest.raises(InvalidRequest, match="not a PettingZoo env id"):
        GameOrchestrator().validate_initialize({"id": "CartPole-v1"}, 1)
    assert GameOrchestrator().validate_initialize({"id": "tictactoe_v3"}, 2) is None


@pytest.mark.parametrize("capabilities", [frozenset({"step"}), frozenset()])
def test_alternating_seats_bookkeeping(capabilities):
    """Lowest-legal-cell play: X (player_1) always wins in 7 moves (cells 0,2,4,6), so the
    results say exactly who held which seat in each game."""
    a, b = ScriptedClient(), ScriptedClient()
    orch = _orchestrator(
        TICTACTOE, {"a": (a, ("player_1",)), "b": (b, ("player_2",))}, capabilities
    )
    orch.do_start_episode(
        EpisodeConfig(num_episodes=8, num_envs=4, seed=0, seat_assignment="alternate")
    )
    assert len(orch.results) == 8
    for result in orch.results:
        assert result["winner"] == "player_1" and result["length"] == 7
        assert result["returns"] == {"player_1": 1.0, "player_2": -1.0}
        assert result["agent"] == result["seats"]["player_1"]
        assert sorted(result["seats"].values()) == ["a", "b"]
    held_x = {name: sum(r["seats"]["player_1"] == name for r in orch.results) for name in "ab"}
    assert held_x == {"a": 4, "b": 4}
    for name in "ab":
        totals = orch.totals[name]
        assert totals["player_1"]["win"] == totals["player_1"]["games"] == 4
        assert totals["player_2"]["loss"] == totals["player_2"]["games"] == 4
        assert orch.moves_by_agent[name] == 4 * 4 + 4 * 3  # 4 moves as X, 3 as O
    # every request to an agent named only seats it held in that copy's game
    assert len(a.asked) == len(b.asked) == 28
    totals = orch.extra_results()["totals"]
    assert totals["a"]["player_1"]["win"] == 4


def test_transitions_of_a_turn_based_game():
    """One agent holds both seats: the loser's terminal transition carries -1, the
    winner's +1; each transition runs to the seat's next decision, carrying its mask."""
    me = ScriptedClient()
    orch = _orchestrator(TICTACTOE, {"me": (me, ("player_1", "player_2"))})
    orch.do_start_episode(EpisodeConfig(num_episodes=1, seed=0))
    x, o = me.transitions["player_1:0"], me.transitions["player_2:0"]
    assert [t["actions"] for t in x] == [0, 2, 4, 6] and [t["actions"] for t in o] == [1, 3, 5]
    assert x[-1]["rewards"] == 1.0 and x[-1]["terminated"]
    assert o[-1]["rewards"] == -1.0 and o[-1]["terminated"]  # after X's winning move
    for stream in (x, o):
        for t, following in zip(stream, stream[1:]):
            assert t["rewards"] == 0.0 and not t["terminated"] and not t["truncated"]
            # to the seat's next decision: the next transition starts where this one ends
            np.testing.assert_array_equal(t["newObs"], following["prevObs"])
            empty = (np.asarray(t["newObs"]).sum(axis=-1) == 0).reshape(-1)
            np.testing.assert_array_equal(np.asarray(t["newActionMask"], bool), empty)
        assert not np.asarray(stream[-1]["newActionMask"]).any()  # no move after the end
    # O's last observation is the final board: X's four marks, O's three, from O's side
    final = np.asarray(o[-1]["newObs"])
    assert final[..., 0].sum() == 3 and final[..., 1].sum() == 4


def test_an_illegal_move_loses_and_is_counted():
    def cheat(entity, obs, mask):  # O plays into an occupied cell on its second move
        return 0 if obs.sum() >= 3 else int(np.flatnonzero(mask)[0])

    x, o = ScriptedClient(), ScriptedClient(cheat)
    orch = _orchestrator(TICTACTOE, {"x": (x, ("player_1",)), "o": (o, ("player_2",))})
    orch.do_start_episode(EpisodeConfig(num_episodes=2, seed=0))
    for result in orch.results:
        assert result["winner"] == "player_1" and result["illegal"]["player_2"] == 1
        assert result["length"] == 4
    assert orch.totals["o"]["player_2"]["illegal"] == 2
    assert orch.totals["o"]["player_2"]["loss"] == 2
    last = o.transitions["player_2:0"][-1]
    assert last["actions"] == 0 and last["rewards"] == -1.0 and last["terminated"]
    assert x.transitions["player_1:0"][-1]["terminated"]


def test_rps_result_is_the_sign_of_the_summed_rewards():
    rng = np.random.default_rng(0)
    a = ScriptedClient(lambda e, obs, mask: int(rng.integers(3)))
    b = ScriptedClient(lambda e, obs, mask: int(rng.integers(3)))
    orch = _orchestrator(RPS, {"a": (a, ()), "b": (b, ())})
    orch.do_start_episode(EpisodeConfig(num_episodes=24, num_envs=3, seed=0))
    assert orch.api == "parallel" and len(orch.results) == 24
    sums: dict[tuple, list[float]] = defaultdict(list)  # (copy, seat) -> per game
    for client in (a, b):
        for entity, stream in client.transitions.items():
            seat, copy = entity.split(":")
            total = 0.0
            for t in stream:
                total += t["rewards"]
                if t["truncated"] or t["terminated"]:
                    sums[(int(copy), seat)].append(total)
                    total = 0.0
    outcomes = set()
    for copy in range(3):
        games = [r for r in orch.results if r["envIndex"] == copy]
        for k, result in enumerate(games):
            s0, s1 = sums[(copy, "player_0")][k], sums[(copy, "player_1")][k]
            assert result["returns"] == {"player_0": s0, "player_1": s1}
            expected = {1: "player_0", -1: "player_1", 0: None}[int(np.sign(s0 - s1))]
            assert result["winner"] == expected and result["truncated"]
            outcomes.add(expected)
    assert len(outcomes) == 3  # wins both ways and draws happened: the check saw each case


def test_per_agent_modes_and_training():
    learner, frozen = ScriptedClient(), ScriptedClient()
    orch = _orchestrator(TICTACTOE, {"l": (learner, ()), "f": (frozen, ())})
    config = EpisodeConfig(
        num_episodes=2, seed=0, agents={"f": AgentSettings(mode="collect", train=False)}
    )
    orch.validate_agent_settings(config)
    orch.do_start_episode(config)
    assert learner.modes == ["collect"] and frozen.modes == ["collect"]
    assert learner.transitions and not frozen.transitions  # explores, never learns
    with pytest.raises(InvalidRequest, match="not registered"):
        orch.validate_agent_settings(EpisodeConfig(agents={"nobody": AgentSettings()}))
    with pytest.raises(InvalidRequest, match="train needs mode collect"):
        orch.validate_agent_settings(
            EpisodeConfig(agents={"l": AgentSettings(mode="eval", train=True)})
        )
    with pytest.raises(InvalidRequest, match="resume"):  # a gym option: not a game's
        refuse_unknown_options(
            {"numSteps": 10, "resume": True},
            orch.episode_settings,
            "startEpisode",
            "GameOrchestrator",
        )


def test_num_steps_finishes_the_games_in_progress():
    me = ScriptedClient()
    orch = _orchestrator(TICTACTOE, {"me": (me, ())})
    orch.do_start_episode(EpisodeConfig(num_steps=20, num_envs=2, seed=0))
    assert orch.env_steps >= 20 and all(r["length"] == 7 for r in orch.results)
    assert orch.env_steps == 7 * len(orch.results)  # no game cut


def _opponent_client(opponent):
    rng = np.random.default_rng(0)

    def policy(entity, obs, mask):
        return int(opponent.act(obs[None], mask[None], rng)[0])

    return ScriptedClient(policy)


def test_exhaustive_evaluation_counts_lines_and_exact_odds():
    orch = _orchestrator(TICTACTOE, {"p": (ScriptedClient(), ())})
    perfect = TicTacToePerfect(*orch.spaces["player_1"])
    orch.agents["p"].client = _opponent_client(perfect)
    orch.validate_start_episode(
        EpisodeConfig(exhaustive=ExhaustiveSpec(agent="p", opponent="tictactoe_perfect"))
    )
    orch.do_start_episode(
        EpisodeConfig(exhaustive=ExhaustiveSpec(agent="p", opponent="tictactoe_perfect"))
    )
    report = orch.evaluations[-1]
    assert report["complete"]
    for seat in orch.seats:  # perfect against perfect: every line a draw
        tally = report["seats"][seat]
        assert tally["lines"] == tally["drawnLines"] > 0 and tally["draw"] == pytest.approx(1)
    # lowest legal cell against every random reply: exact odds sum to one
    orch.agents["p"].client = ScriptedClient()
    orch.do_start_episode(EpisodeConfig(exhaustive=ExhaustiveSpec(agent="p", opponent="random")))
    first = orch.evaluations[-1]["seats"]["player_1"]
    assert first["win"] + first["draw"] + first["loss"] == pytest.approx(1)
    assert first["lines"] == first["wonLines"] + first["drawnLines"] + first["lostLines"]
    assert 0 < first["lostLines"] < first["lines"]
    # the exact odds agree with sampled games against the random agent (1,000 games)
    sampled = _orchestrator(
        TICTACTOE,
        {
            "p": (ScriptedClient(), ("player_1",)),
            "r": (_opponent_client(MaskedRandom(*orch.spaces["player_1"])), ("player_2",)),
        },
    )
    sampled.do_start_episode(EpisodeConfig(num_episodes=1000, num_envs=16, seed=0))
    wins = sampled.totals["p"]["player_1"]["win"] / 1000
    assert abs(wins - first["win"]) < 4 * np.sqrt(first["win"] * (1 - first["win"]) / 1000)
    with pytest.raises(InvalidRequest, match="connect4_winblock"):
        orch.validate_start_episode(
            EpisodeConfig(exhaustive=ExhaustiveSpec(agent="p", opponent="connect4_winblock"))
        )


def test_a_lineup_picks_who_plays_this_call():
    """The learner holds both seats; a random opponent registered after it sits on the
    bench until a lineup names it, and only the agents in the lineup are asked."""
    learner, bench = ScriptedClient(), ScriptedClient()
    orch = _orchestrator(
        TICTACTOE, {"learner": (learner, ("player_1", "player_2")), "bench": (bench, ())}
    )
    assert orch.agents["bench"].seats == ()
    orch.do_start_episode(EpisodeConfig(num_episodes=2, seed=0))
    assert bench.modes == [] and not bench.asked  # self-play: the bench sat out
    lineup = {"player_1": "bench", "player_2": "learner"}
    orch.validate_start_episode(EpisodeConfig(lineup=lineup))
    orch.do_start_episode(
        EpisodeConfig(num_episodes=4, seed=0, lineup=lineup, seat_assignment="alternate")
    )
    played = orch.results[2:]
    assert [r["seats"]["player_1"] for r in played].count("bench") == 2
    assert bench.modes == ["collect"] and len(bench.asked) == 2 * 4 + 2 * 3
    with pytest.raises(InvalidRequest, match="has player_1, player_2"):
        orch.validate_start_episode(EpisodeConfig(lineup={"player_1": "bench"}))
    with pytest.raises(InvalidRequest, match="not registered"):
        orch.validate_start_episode(
            EpisodeConfig(lineup={"player_1": "bench", "player_2": "ghost"})
        )
