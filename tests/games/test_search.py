"""The searching opponents (`mistk_rl.games.search`): their bitboards agree with the array
logic already checked against PettingZoo's envs, alpha-beta never misses a win in one or a
block it can make, and Monte-Carlo tree search plays legal moves drawn from its generator
and is refused where its moves would have to be enumerated."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.games import connect_four as c4
from mistk_rl.games import tictactoe
from mistk_rl.games.enumerate import check_enumerable
from mistk_rl.games.opponents import OPPONENTS
from mistk_rl.games.pettingzoo_games import probe_game
from mistk_rl.games.search import alphabeta_moves, mcts_move

C4_SPACES = (spaces.Box(0, 1, (c4.ROWS, c4.COLS, 2), np.int8), spaces.Discrete(c4.COLS))
TTT_SPACES = (spaces.Box(0, 1, (3, 3, 2), np.int8), spaces.Discrete(9))


def _drop(obs: np.ndarray, col: int) -> np.ndarray:
    """The position after the player to move drops in `col`, seen by the other player."""
    board = obs.copy()
    board[c4.landing_row(obs, col), col, c4.OWN] = 1
    return board[..., ::-1].copy()


def _ttt_play(obs: np.ndarray, cell: int) -> np.ndarray:
    """The position after the player to move marks `cell`, seen by the other player."""
    board = obs.copy()
    board.reshape(9, 2)[cell, 0] = 1
    return board[..., ::-1].copy()


def _c4_positions(n: int, seed: int) -> list[np.ndarray]:
    """Positions of random games, none decided yet (each seen by the player to move)."""
    rng, positions = np.random.default_rng(seed), []
    while len(positions) < n:
        obs = np.zeros((c4.ROWS, c4.COLS, 2), np.int8)
        while True:
            legal = c4.legal_columns(obs)
            if not legal:
                break
            positions.append(obs)
            col = legal[rng.integers(len(legal))]
            if c4.drop_wins(obs, col):
                break
            obs = _drop(obs, col)
    return positions[:n]


def test_connect_four_bitboards_agree_with_the_board_arrays():
    rules = c4.ConnectFourRules()
    for obs in _c4_positions(300, seed=0):
        own, other = c4.bitboards(obs)
        assert rules.moves(own, other) == [
            c for c in (3, 2, 4, 1, 5, 0, 6) if c in c4.legal_columns(obs)
        ]
        for col in rules.moves(own, other):
            after = rules.play(own, other, col)
            assert rules.won(after) == c4.drop_wins(obs, col)
            assert c4.bitboards(_drop(obs, col)) == (other, after)  # (the roles swap)


@pytest.mark.parametrize("opponent", ["connect4_alphabeta2", "connect4_alphabeta4"])
def test_alphabeta_never_misses_a_win_or_a_block_in_one(opponent):
    player, checked = OPPONENTS[opponent](*C4_SPACES), {"wins": 0, "blocks": 0}
    for obs in _c4_positions(400, seed=1):
        replies = player.replies(obs, None)
        legal = c4.legal_columns(obs)
        assert replies and set(replies) <= set(legal)
        wins = [c for c in legal if c4.drop_wins(obs, c)]
        threats = [c for c in legal if c4.drop_wins(obs, c, c4.OTHER)]
        if wins:
            assert set(replies) <= set(wins)
            checked["wins"] += 1
        elif len(threats) == 1:
            (block,) = threats
            after = _drop(obs, block)  # (a block that opens a win above it loses anyway)
            if not any(c4.drop_wins(after, c) for c in c4.legal_columns(after)):
                assert replies == [block]
                checked["blocks"] += 1
    assert checked["wins"] > 20 and checked["blocks"] > 20  # (the positions had both)


def test_tictactoe_alphabeta_takes_every_win_and_blocks_every_threat_it_can():
    """Every position of tic-tac-toe where a move wins or one threat must be blocked (the
    whole tree, by exhaustive play from the empty board)."""
    player, seen, checked = OPPONENTS["tictactoe_alphabeta2"](*TTT_SPACES), set(), 0
    boards = [np.zeros((3, 3, 2), np.int8)]
    while boards:
        obs = boards.pop()
        own, other = key = tictactoe.board_key(obs)
        if key in seen or tictactoe.game_result(obs) is not None:
            continue
        seen.add(key)
        legal = tictactoe.legal_moves(obs)
        replies = player.replies(obs, None)
        wins = [c for c in legal if tictactoe._has_line(own | 1 << c)]
        threats = [c for c in legal if tictactoe._has_line(other | 1 << c)]
        if wins:
            assert set(replies) <= set(wins)
        elif len(threats) == 1:
            assert replies == threats
        checked += bool(wins) or len(threats) == 1
        for cell in legal:
            boards.append(_ttt_play(obs, cell))
    assert len(seen) > 4000 and checked > 1000


def test_alphabeta_searched_to_the_end_plays_only_optimal_tictactoe_moves():
    rules, rng = tictactoe.TicTacToeRules(), np.random.default_rng(2)
    for _ in range(20):
        obs = np.zeros((3, 3, 2), np.int8)
        while tictactoe.game_result(obs) is None:
            own, other = tictactoe.board_key(obs)
            best = alphabeta_moves(rules, own, other, depth=9)
            assert best and set(best) <= set(tictactoe.optimal_moves(obs))
            legal = tictactoe.legal_moves(obs)
            cell = legal[rng.integers(len(legal))]
            obs = _ttt_play(obs, cell)


def test_mcts_plays_legal_moves_drawn_from_its_generator_and_takes_a_win():
    player = OPPONENTS["connect4_mcts50"](*C4_SPACES)
    positions = np.stack(_c4_positions(40, seed=3))
    first = player.act(positions, None, np.random.default_rng(0))
    again = player.act(positions, None, np.random.default_rng(0))
    other = player.act(positions, None, np.random.default_rng(1))
    assert first.tolist() == again.tolist() and first.tolist() != other.tolist()
    for obs, col in zip(positions, first.tolist()):
        assert col in c4.legal_columns(obs)
        wins = [c for c in c4.legal_columns(obs) if c4.drop_wins(obs, c)]
        assert not wins or col in wins


def _missed_blocks(name: str, games: int = 60) -> tuple[int, int]:
    """(losses in one it left, those it blocked) over the positions of random games where
    it must block (one generator for the games and the search)."""
    player, rng, missed, blocked = OPPONENTS[name](*TTT_SPACES), np.random.default_rng(4), 0, 0
    for _ in range(games):
        obs = np.zeros((3, 3, 2), np.int8)
        while tictactoe.game_result(obs) is None:
            own, other = tictactoe.board_key(obs)
            legal = tictactoe.legal_moves(obs)
            wins = [c for c in legal if tictactoe._has_line(own | 1 << c)]
            threats = [c for c in legal if tictactoe._has_line(other | 1 << c)]
            move = int(player.act(obs[None], None, rng)[0])
            if wins:
                assert move in wins
            elif len(threats) == 1:
                missed, blocked = missed + (move != threats[0]), blocked + (move == threats[0])
            cell = legal[rng.integers(len(legal))]  # (the game goes on at random)
            obs = _ttt_play(obs, cell)
    return missed, blocked


def test_tictactoe_mcts_sees_a_loss_coming_the_more_it_simulates():
    """Random rollouts dilute a single losing reply: with 25 simulations a move the search
    leaves about a fifth of the losses in one it should block, with 400 none here."""
    missed = {n: _missed_blocks(f"tictactoe_mcts{n}") for n in (25, 100, 400)}
    assert missed[25][0] > missed[100][0] > missed[400][0] == 0
    assert all(blocked > 40 for _, blocked in missed.values())


def test_a_finished_game_has_no_search():
    won = np.zeros((3, 3, 2), np.int8)
    won[0, :, 1] = 1  # the other player has the top row
    assert OPPONENTS["tictactoe_mcts25"](*TTT_SPACES)._open(won) is None
    with pytest.raises(ValueError, match="no move"):
        OPPONENTS["tictactoe_mcts100"](*TTT_SPACES).act(won[None], None, np.random.default_rng())
    with pytest.raises(ValueError, match="over"):
        mcts_move(
            tictactoe.TicTacToeRules(), *tictactoe.board_key(won), 10, np.random.default_rng()
        )
    with pytest.raises(ValueError, match="depth"):
        alphabeta_moves(tictactoe.TicTacToeRules(), 0, 0, 0)


def test_mcts_is_refused_for_an_exhaustive_evaluation():
    game = probe_game({"id": "classic/tictactoe-v3"})
    check_enumerable(game, "p", "tictactoe_perfect", ["p"])  # (an enumerable one passes)
    with pytest.raises(InvalidRequest, match="chance.*sampled games"):
        check_enumerable(game, "p", "tictactoe_mcts100", ["p"])


def test_a_searcher_is_served_off_the_event_loop_and_refused_on_it():
    from agents.opponent_agents import OpponentAgent, SearchOpponentAgent

    with pytest.raises(InvalidRequest, match="SearchOpponentAgent"):
        OpponentAgent().validate_initialize({}, {"opponent": "connect4_mcts200"})
    OpponentAgent().validate_initialize({}, {"opponent": "connect4_winblock"})
    agent = SearchOpponentAgent()
    agent.validate_initialize({}, {"opponent": "connect4_mcts200", "seed": 0})
    assert not agent.steps_inline
