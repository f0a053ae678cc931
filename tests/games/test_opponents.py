"""The built-in game opponents, checked against the real PettingZoo envs: the encodings the
board logic assumes, perfect tic-tac-toe by exhaustive enumeration, connect-four win/block,
and the agent classes that serve them.

PettingZoo's classic envs cannot be copied (deepcopy goes through EzPickle, which builds a
fresh, un-reset env), so a position is reached by replaying its moves from reset."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pettingzoo
import pytest
from gymnasium import spaces

from agents.opponent_agents import (
    ConnectFourWinBlockAgent,
    MaskedRandomAgent,
    OpponentAgent,
    TicTacToePerfectAgent,
)
from mistk_rl.errors import InvalidRequest
from mistk_rl.games import connect_four, tictactoe
from mistk_rl.games.connect_four import OTHER, OWN
from mistk_rl.games.opponents import (
    OPPONENTS,
    ConnectFourWinBlock,
    MaskedRandom,
    TicTacToePerfect,
    UniformOpponent,
)

TICTACTOE, CONNECT_FOUR = "classic/tictactoe-v3", "classic/connect_four-v3"
Chooser = Callable[[str, dict], Sequence[int]]  # (agent to move, its observation) -> moves


def make(env_id: str):
    return pettingzoo.make("aec", env_id)


def replay(env, moves: Sequence[int]) -> tuple:
    """Steps `env` through `moves` from reset; the last() of the agent to move."""
    env.reset(seed=0)
    for move in moves:
        env.step(move)
    return env.last()


def spaces_of(env_id: str) -> tuple[spaces.Space, spaces.Space]:
    """What an orchestrator registers: the "observation" Box and the action space."""
    env = make(env_id)
    agent = env.possible_agents[0]
    return env.observation_space(agent)["observation"], env.action_space(agent)


def opponent(cls: type[UniformOpponent], env_id: str) -> Chooser:
    """`cls`'s replies, as a chooser reading the env's observation dict."""
    player = cls(*spaces_of(env_id))
    return lambda agent, obs: player.replies(obs["observation"], obs["action_mask"])


# ---- tic-tac-toe ---------------------------------------------------------------------------
def explore(
    env, hero: str, choose: Chooser, moves: tuple[int, ...] = (), memo: Optional[dict] = None
) -> tuple[Counter, Counter]:
    """Every tic-tac-toe game on from `moves` where the player to move plays each move
    `choose` offers: (games counted by `hero`'s final reward, the probability of each final
    reward when every choice is uniform). Checks the board logic against the env in every
    position on the way. A position reached by several move orders is explored once."""
    memo = {} if memo is None else memo
    obs, _, terminated, truncated, _ = replay(env, moves)
    board = obs["observation"]
    if terminated or truncated:
        for seat in env.possible_agents:
            result = tictactoe.game_result(env.observe(seat)["observation"])
            assert result is not None and result == env.rewards[seat], (moves, seat)
        reward = env.rewards[hero]
        return Counter({reward: 1}), Counter({reward: 1.0})
    assert tictactoe.game_result(board) is None, moves
    assert tictactoe.legal_moves(board) == np.flatnonzero(obs["action_mask"]).tolist(), moves
    key = (env.agent_selection, board.tobytes())
    if key not in memo:
        games, probability = Counter(), Counter()
        options = choose(env.agent_selection, obs)
        for move in options:
            child_games, child_probability = explore(env, hero, choose, moves + (move,), memo)
            games.update(child_games)
            for reward, p in child_probability.items():
                probability[reward] += p / len(options)
        memo[key] = games, probability
    return memo[key]


def test_tictactoe_board_logic_agrees_with_the_env_in_every_game() -> None:
    env = make(TICTACTOE)
    anyone = opponent(MaskedRandom, TICTACTOE)
    games, _ = explore(env, env.possible_agents[0], anyone)
    # every tic-tac-toe game: 255,168, of which the first player wins 131,184, the second
    # 77,904 (a check that the enumeration itself reaches every game once)
    assert games == {1: 131184, -1: 77904, 0: 46080}


@pytest.mark.parametrize("seat, p_win", [(0, 0.9678), (1, 0.7775)])
def test_perfect_player_never_loses_and_beats_random_as_often_as_expected(
    seat: int, p_win: float
) -> None:
    env = make(TICTACTOE)
    hero = env.possible_agents[seat]
    perfect, anyone = opponent(TicTacToePerfect, TICTACTOE), opponent(MaskedRandom, TICTACTOE)
    games, probability = explore(
        env, hero, lambda agent, obs: (perfect if agent == hero else anyone)(agent, obs)
    )
    assert games[-1] == 0 and games[1] > 0 and games[0] > 0
    assert sum(probability.values()) == pytest.approx(1.0)
    assert probability[1] == pytest.approx(p_win, abs=5e-5)


def test_tictactoe_values_of_known_positions() -> None:
    empty = np.zeros((3, 3, 2), dtype=np.int8)
    assert tictactoe.value(empty) == 0
    assert tictactoe.optimal_moves(empty) == list(range(9))  # every opening draws
    corner = empty.copy()
    corner[0, 0, 1] = 1  # the other player took a corner: only the centre holds the draw
    assert tictactoe.optimal_moves(corner) == [4]
    fork = empty.copy()  # own marks at 0 and 4, the other's at 1 and 8
    fork.reshape(9, 2)[[0, 4], 0] = 1
    fork.reshape(9, 2)[[1, 8], 1] = 1
    assert tictactoe.value(fork) == 1
    assert tictactoe.optimal_moves(fork) == [3, 6]  # each makes two threats (2 makes one)
    assert tictactoe.optimal_moves(np.ones((3, 3, 2))) == []


# ---- connect four --------------------------------------------------------------------------
def play(env, players: dict[str, UniformOpponent], seed: int) -> dict[str, float]:
    """One game, each agent acting through its opponent's batched `act`; final rewards."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    final = {}
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, _ = env.last()
        if terminated or truncated:
            final[agent] = reward
            env.step(None)
            continue
        action = players[agent].act(obs["observation"][None], obs["action_mask"][None], rng)
        env.step(int(action[0]))
    return final


# moves from reset, player_0 first; then player_0 is to move
WIN_IN_A_ROW = (3, 0, 4, 0, 5, 6)  # player_0 holds 3, 4, 5 of the bottom row; 6 is taken
WIN_OVER_BLOCK = (0, 1, 0, 1, 0, 1)  # both hold three in a column: win, don't block
BLOCK = (6, 3, 6, 4, 0, 5)  # player_1 holds 3, 4, 5 of the bottom row; player_0 has no win


@pytest.mark.parametrize("moves, expected", [(WIN_IN_A_ROW, 2), (WIN_OVER_BLOCK, 0)])
def test_winblock_takes_an_immediate_win(moves: tuple[int, ...], expected: int) -> None:
    env = make(CONNECT_FOUR)
    obs, *_ = replay(env, moves)
    assert connect_four.winblock_moves(obs["observation"], obs["action_mask"]) == [expected]
    _, _, terminated, _, _ = replay(env, moves + (expected,))
    assert terminated and env.rewards == {"player_0": 1, "player_1": -1}


def test_winblock_blocks_an_immediate_threat() -> None:
    env = make(CONNECT_FOUR)
    obs, *_ = replay(env, BLOCK)
    assert connect_four.winblock_moves(obs["observation"], obs["action_mask"]) == [2]
    obs, *_ = replay(env, BLOCK + (2,))
    replies = np.flatnonzero(obs["action_mask"]).tolist()
    assert len(replies) == 7
    for reply in replies:  # no reply of player_1 wins now
        replay(env, BLOCK + (2, reply))
        assert env.rewards["player_1"] != 1, reply


def test_connect_four_board_logic_agrees_with_the_env() -> None:
    """In random games, for every legal column: where the piece lands and whether it wins,
    against what the env does when it is played; and plane 1 is the other's plane 0."""
    env = make(CONNECT_FOUR)
    rng = np.random.default_rng(0)
    wins_seen = 0
    for _ in range(8):
        moves: tuple[int, ...] = ()
        while True:
            obs, _, terminated, _, _ = replay(env, moves)
            if terminated:
                break
            me = env.agent_selection
            other = next(a for a in env.possible_agents if a != me)
            board, mask = obs["observation"], obs["action_mask"]
            assert connect_four.legal_columns(board) == np.flatnonzero(mask).tolist()
            their_view = env.observe(other)["observation"]
            for col in connect_four.legal_columns(board):
                row = connect_four.landing_row(board, col)
                assert connect_four.drop_wins(board, col, OTHER) == connect_four.drop_wins(
                    their_view, col, OWN
                )
                wins = connect_four.drop_wins(board, col, OWN)
                replay(env, moves + (col,))
                assert env.observe(me)["observation"][row, col, 0] == 1, (moves, col)
                assert wins == (env.rewards[me] == 1), (moves, col)
                wins_seen += wins
            moves += (int(rng.choice(connect_four.legal_columns(board))),)
    assert wins_seen > 0


@pytest.mark.parametrize("seat", [0, 1])
def test_winblock_beats_random(seat: int) -> None:
    env = make(CONNECT_FOUR)
    hero, villain = env.possible_agents[seat], env.possible_agents[1 - seat]
    players = {
        hero: ConnectFourWinBlock(*spaces_of(CONNECT_FOUR)),
        villain: MaskedRandom(*spaces_of(CONNECT_FOUR)),
    }
    games = 300
    wins = sum(play(env, players, seed)[hero] == 1 for seed in range(games))
    assert wins / games >= 0.85


# ---- agent services (in-process) -----------------------------------------------------------
def registered(
    agent_cls: type[OpponentAgent],
    env_id: str,
    seed: Optional[int] = 0,
    data_dir: Optional[Path] = None,
) -> OpponentAgent:
    """Through the hooks in the order the service calls them."""
    agent = agent_cls()
    hparams = {"seed": seed}
    agent.validate_initialize({}, hparams)
    agent.do_initialize({}, hparams)
    agent.do_build_model(data_dir)
    observation_space, action_space = spaces_of(env_id)
    agent.validate_registration(observation_space, action_space)
    agent.name = "opponent"
    agent.observation_space, agent.action_space = observation_space, action_space
    agent.do_agent_registered({"name": "opponent"})
    return agent


def positions(env_id: str, count: int) -> tuple[dict, dict]:
    """`count` positions of one random game (every other one, so both seats' views)."""
    env = make(env_id)
    rng = np.random.default_rng(1)
    obs, masks, moves = {}, {}, ()
    while len(obs) < count:
        last, _, terminated, _, _ = replay(env, moves)
        if terminated:
            moves = ()
            continue
        entity = f"e{len(obs)}"
        obs[entity], masks[entity] = last["observation"], last["action_mask"]
        moves += (int(rng.choice(np.flatnonzero(last["action_mask"]))),)
    return obs, masks


@pytest.mark.parametrize(
    "agent_cls, env_id",
    [
        (TicTacToePerfectAgent, TICTACTOE),
        (ConnectFourWinBlockAgent, CONNECT_FOUR),
        (MaskedRandomAgent, TICTACTOE),
        (MaskedRandomAgent, CONNECT_FOUR),
    ],
)
def test_agents_answer_every_entity_with_one_of_their_replies(
    agent_cls: type[OpponentAgent], env_id: str
) -> None:
    agent = registered(agent_cls, env_id)
    obs, masks = positions(env_id, 7)
    actions = agent.do_get_action(obs, masks)
    assert set(actions) == set(obs)
    for entity, action in actions.items():
        assert type(action) is int and masks[entity][action] == 1, entity
        assert action in agent.opponent.replies(obs[entity], masks[entity]), entity
    assert agent.actions_taken == len(obs)


def test_agents_without_masks_take_the_board_or_the_whole_space() -> None:
    obs, _ = positions(TICTACTOE, 5)
    perfect = registered(TicTacToePerfectAgent, TICTACTOE).do_get_action(obs)
    assert all(perfect[e] in tictactoe.optimal_moves(obs[e]) for e in obs)
    anything = registered(MaskedRandomAgent, TICTACTOE).do_get_action(obs)
    assert all(0 <= anything[e] < 9 for e in obs)


def test_the_seed_reproduces_the_choices_and_survives_a_save(tmp_path: Path) -> None:
    obs, masks = positions(CONNECT_FOUR, 20)
    first = registered(MaskedRandomAgent, CONNECT_FOUR, seed=7)
    first.do_save_model(tmp_path / "random.json")
    restored = registered(
        MaskedRandomAgent, CONNECT_FOUR, seed=None, data_dir=tmp_path / "random.json"
    )
    assert restored.seed == 7
    actions = first.do_get_action(obs, masks)
    assert restored.do_get_action(obs, masks) == actions
    assert registered(MaskedRandomAgent, CONNECT_FOUR, seed=8).do_get_action(obs, masks) != actions


def test_a_save_of_another_opponent_is_refused(tmp_path: Path) -> None:
    registered(MaskedRandomAgent, TICTACTOE).do_save_model(tmp_path / "random.json")
    with pytest.raises(ValueError, match="MaskedRandomAgent"):
        TicTacToePerfectAgent().do_build_model(tmp_path / "random.json")


@pytest.mark.parametrize(
    "agent_cls, observation_space, action_space, complaint",
    [
        (TicTacToePerfectAgent, *spaces_of(CONNECT_FOUR), "Discrete\\(9\\)"),
        (TicTacToePerfectAgent, spaces.Box(0, 1, (6, 7, 2)), spaces.Discrete(9), "\\(3, 3, 2\\)"),
        (ConnectFourWinBlockAgent, *spaces_of(TICTACTOE), "Discrete\\(7\\)"),
        (
            ConnectFourWinBlockAgent,
            make(CONNECT_FOUR).observation_space("player_0"),
            spaces.Discrete(7),
            "Box of shape",
        ),  # the whole Dict, not its "observation"
        (MaskedRandomAgent, spaces.Box(0, 1, (3,)), spaces.Box(-1, 1, (2,)), "Discrete"),
        (MaskedRandomAgent, spaces.Box(0, 1, (3,)), spaces.Discrete(3, start=1), "starting at 0"),
        (MaskedRandomAgent, None, spaces.Discrete(3), "needs observationSpace"),
    ],
)
def test_spaces_an_opponent_cannot_play_in_are_refused(
    agent_cls: type[OpponentAgent],
    observation_space: Optional[spaces.Space],
    action_space: spaces.Space,
    complaint: str,
) -> None:
    with pytest.raises(InvalidRequest, match=complaint):
        agent_cls().validate_registration(observation_space, action_space)
    if observation_space is not None:
        with pytest.raises(ValueError, match=complaint):
            agent_cls.opponent_cls(observation_space, action_space)


@pytest.mark.parametrize("hparams", [{"seed": -1}, {"seed": 1.5}, {"seed": True}, {"sead": 1}])
def test_bad_hyperparameters_are_refused(hparams: dict) -> None:
    with pytest.raises(InvalidRequest, match="seed|sead"):
        MaskedRandomAgent().validate_initialize({}, hparams)


def test_registry_names_each_opponent_once() -> None:
    assert {name: cls.name for name, cls in OPPONENTS.items()} == {
        "random": "random",
        "tictactoe_perfect": "tictactoe_perfect",
        "connect4_winblock": "connect4_winblock",
        "tictactoe_alphabeta2": "tictactoe_alphabeta2",
        **{f"tictactoe_mcts{n}": f"tictactoe_mcts{n}" for n in (25, 100, 400)},
        **{f"connect4_alphabeta{d}": f"connect4_alphabeta{d}" for d in (2, 4)},
        **{f"connect4_mcts{n}": f"connect4_mcts{n}" for n in (50, 200, 800)},
    }
    assert OPPONENTS["tictactoe_perfect"] is TicTacToePerfect


def test_an_opponent_with_nothing_to_play_says_so() -> None:
    player = MaskedRandom(spaces.Box(0, 1, (3,)), spaces.Discrete(3))
    with pytest.raises(ValueError, match="no move"):
        player.act(np.zeros((2, 3)), np.array([[0, 1, 0], [0, 0, 0]]), np.random.default_rng())


def test_the_generic_opponent_agent_plays_any_registered_opponent() -> None:
    """`OpponentAgent` with hyperparameters.opponent: a new opponent needs no agent class."""
    agent = OpponentAgent()
    with pytest.raises(InvalidRequest, match="opponent is required"):
        agent.validate_initialize({}, {})
    with pytest.raises(InvalidRequest, match="Did you mean 'tictactoe_perfect'"):
        agent.validate_initialize({}, {"opponent": "tictactoe_perfekt"})
    agent.validate_initialize({}, {"opponent": "tictactoe_perfect", "seed": 3})
    agent.do_initialize({}, {"opponent": "tictactoe_perfect", "seed": 3})
    assert agent.playing is TicTacToePerfect
    with pytest.raises(InvalidRequest, match="\\(3, 3, 2\\)"):
        agent.validate_registration(spaces.Box(0, 1, (6, 7, 2)), spaces.Discrete(9))
