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
