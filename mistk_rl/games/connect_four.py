"""Connect four seen by the player to move, read off PettingZoo's ``connect_four-v3``
observation (6, 7, 2): plane 0 holds the observer's pieces, plane 1 the other player's; row 0
is the top, a piece falls to the lowest empty row, and action c drops one in column c."""

from __future__ import annotations

from typing import Optional

import numpy as np

ROWS, COLS = 6, 7
OWN, OTHER = 0, 1  # observation planes
_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def legal_columns(obs: np.ndarray) -> list[int]:
    """Columns whose top cell is empty."""
    top = np.asarray(obs)[0].any(axis=-1)
    return [col for col in range(COLS) if not top[col]]


def landing_row(obs: np.ndarray, col: int) -> int:
    """The row a piece dropped in `col` comes to rest in."""
    empty = np.flatnonzero(~np.asarray(obs)[:, col].any(axis=-1))
    if not empty.size:
        raise ValueError(f"column {col} is full")
    return int(empty[-1])


def drop_wins(obs: np.ndarray, col: int, player: int = OWN) -> bool:
    """Whether a piece of `player` (OWN or OTHER) dropped in `col` makes four in a row."""
    pieces = np.asarray(obs)[..., player] != 0
    row = landing_row(obs, col)
    for d_row, d_col in _DIRECTIONS:
        run = 1
        for sign in (1, -1):
            r, c = row + sign * d_row, col + sign * d_col
            while 0 <= r < ROWS and 0 <= c < COLS and pieces[r, c]:
                run += 1
                r, c = r + sign * d_row, c + sign * d_col
        if run >= 4:
            return True
    return False


def winblock_moves(obs: np.ndarray, mask: Optional[np.ndarray] = None) -> list[int]:
    """The columns that win now; else those that block an immediate win of the other player;
    else every legal column (`mask` when given, else the open columns)."""
    legal = legal_columns(obs) if mask is None else [c for c in range(COLS) if mask[c]]
    wins = [col for col in legal if drop_wins(obs, col, OWN)]
    if wins:
        return wins
    return [col for col in legal if drop_wins(obs, col, OTHER)] or legal


# Bitboards (`mistk_rl.games.search`): bit 7 * col + height for a piece at that height
# (0: the bottom) in that column; the 7th bit of each column stays empty, so that shifting a
# line never carries into the next column.
_HEIGHT = ROWS + 1
_BOTTOM = [1 << (_HEIGHT * col) for col in range(COLS)]
_TOP = [1 << (_HEIGHT * col + ROWS - 1) for col in range(COLS)]
_COLUMN = [((1 << ROWS) - 1) << (_HEIGHT * col) for col in range(COLS)]
_CENTRE_FIRST = (3, 2, 4, 1, 5, 0, 6)
_WEIGHTS = (0, 1, 2, 3, 2, 1, 0)  # pieces nearer the centre make more lines


def bitboards(obs: np.ndarray) -> tuple[int, int]:
    """(observer's pieces, other's pieces) as bitboards."""
    board = np.asarray(obs) != 0
    masks = [0, 0]
    for row, col, plane in zip(*np.nonzero(board)):
        masks[plane] |= 1 << (_HEIGHT * int(col) + ROWS - 1 - int(row))
    return masks[OWN], masks[OTHER]


class ConnectFourRules:
    """`mistk_rl.games.search.Rules` on `bitboards`: a move is the column."""

    def moves(self, own: int, other: int) -> list[int]:
        taken = own | other
        return [col for col in _CENTRE_FIRST if not taken & _TOP[col]]

    def play(self, own: int, other: int, move: int) -> int:
        taken = own | other
        return own | ((taken + _BOTTOM[move]) & _COLUMN[move])  # the lowest empty cell

    def won(self, marks: int) -> bool:
        for shift in (1, _HEIGHT, _HEIGHT - 1, _HEIGHT + 1):  # vertical, horizontal, diagonals
            pairs = marks & (marks >> shift)
            if pairs & (pairs >> 2 * shift):
                return True
        return False

    def heuristic(self, own: int, other: int) -> float:
        """Centre weight of own pieces less the other's: under 100, far from `WIN`."""
        score = 0
        for col, weight in enumerate(_WEIGHTS):
            if weight:
                score += weight * (
                    (own & _COLUMN[col]).bit_count() - (other & _COLUMN[col]).bit_count()
                )
        return float(score)
