"""Tic-tac-toe seen by the player to move, read off PettingZoo's ``tictactoe-v3`` observation
(3, 3, 2): plane 0 holds the observer's marks, plane 1 the other player's, and cell (i, j) is
action ``3 * i + j``.

A board is keyed by two 9-bit masks (observer's marks, other's marks), bit ``3 * i + j`` for
cell (i, j): the whole game tree is ~5.5k such keys, so exact negamax is memoized over them.
"""

from __future__ import annotations

from functools import cache
from typing import Optional

import numpy as np

CELLS = 9
_LINES = tuple(
    sum(1 << cell for cell in line)
    for line in (
        (0, 1, 2),
        (3, 4, 5),
        (6, 7, 8),
        (0, 3, 6),
        (1, 4, 7),
        (2, 5, 8),
        (0, 4, 8),
        (2, 4, 6),
    )
)
_BIT_WEIGHTS = 1 << np.arange(CELLS)


def board_key(obs: np.ndarray) -> tuple[int, int]:
    """(observer's marks, other's marks) as bit masks."""
    planes = np.asarray(obs).reshape(CELLS, 2) != 0
    return int(_BIT_WEIGHTS @ planes[:, 0]), int(_BIT_WEIGHTS @ planes[:, 1])


def _has_line(marks: int) -> bool:
    return any(marks & line == line for line in _LINES)


def _empty(taken: int) -> list[int]:
    return [cell for cell in range(CELLS) if not taken >> cell & 1]


def _result(own: int, other: int) -> Optional[int]:
    """+1 observer has a line, -1 the other player has, 0 full board, None still open."""
    if _has_line(own):
        return 1
    if _has_line(other):
        return -1
    return 0 if own | other == (1 << CELLS) - 1 else None


@cache
def _value(own: int, other: int) -> int:
    """Negamax value for the player whose marks are `own`, to move."""
    result = _result(own, other)
    if result is not None:
        return result
    return max(-_value(other, own | 1 << cell) for cell in _empty(own | other))


def legal_moves(obs: np.ndarray) -> list[int]:
    """The empty cells (whether or not the game is already decided)."""
    own, other = board_key(obs)
    return _empty(own | other)


def game_result(obs: np.ndarray) -> Optional[int]:
    """For the observer: +1 won, -1 lost, 0 drawn, None while the game goes on."""
    return _result(*board_key(obs))


def value(obs: np.ndarray) -> int:
    """Minimax value for the observer, who is to move: +1 forced win, 0 draw, -1 loss."""
    return _value(*board_key(obs))


def optimal_moves(obs: np.ndarray) -> list[int]:
    """Every move that keeps the minimax value; none once the game is decided."""
    own, other = board_key(obs)
    if _result(own, other) is not None:
        return []
    best = _value(own, other)
    return [cell for cell in _empty(own | other) if -_value(other, own | 1 << cell) == best]


class TicTacToeRules:
    """`mistk_rl.games.search.Rules` on `board_key`'s masks: a move is the cell's index."""

    _ORDER = (4, 0, 2, 6, 8, 1, 3, 5, 7)  # centre, corners, edges: alpha-beta's first tries

    def moves(self, own: int, other: int) -> list[int]:
        taken = own | other
        return [cell for cell in self._ORDER if not taken >> cell & 1]

    def play(self, own: int, other: int, move: int) -> int:
        return own | 1 << move

    def won(self, marks: int) -> bool:
        return _has_line(marks)

    def heuristic(self, own: int, other: int) -> float:
        return 0.0
