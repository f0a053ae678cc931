"""Board symmetries, for data augmentation: what a transition teaches about one position holds
for every position a symmetry of the board maps it to (AlphaZero stores its games so).

A replay buffer that stores each tic-tac-toe transition under the board's 8 symmetries
(rotations and reflections) sees eight times the positions per move; league.md 5.4 measured
it as what let a DQN reach no lost line against the perfect player in both seats. Connect
four has one symmetry, the left-right mirror.

A game's symmetries act on its observation (rows x cols x planes, PettingZoo's layout) and on
its actions through an `action_grid`: the action index at each cell (tic-tac-toe: a move is a
cell, row-major) or at each column (connect four: a move is a column).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

Transform = Callable[[np.ndarray], np.ndarray]  # acts on the first two axes


def _dihedral() -> list[Transform]:
    """The 8 symmetries of a square: 4 rotations, each with and without a reflection."""

    def turn(k: int, flip: bool) -> Transform:
        return lambda a: np.rot90(np.flip(a, 1) if flip else a, k, axes=(0, 1))

    return [turn(k, flip) for flip in (False, True) for k in range(4)]


def _mirror() -> list[Transform]:
    return [lambda a: a, lambda a: np.flip(a, 1)]


class BoardSymmetries:
    """The transforms of one game; `augment` maps a transition to its distinct images."""

    def __init__(self, transforms: list[Transform], action_grid: np.ndarray) -> None:
        self.transforms = transforms
        self.action_grid = action_grid
        # per transform: new index of each old action, and old index of each new one
        self.moved = []
        for transform in transforms:
            source = transform(action_grid).reshape(-1)  # new position i holds old action
            moved = np.empty_like(source)
            moved[source] = np.arange(source.size)
            self.moved.append((moved, source))

    def augment(self, transition: dict) -> list[dict]:
        """The transition under every symmetry (itself first), duplicates dropped: the
        images of a symmetric position would otherwise be sampled several times over."""
        out, seen = [], set()
        action = int(np.asarray(transition["action"]).reshape(()))
        for transform, (moved, source) in zip(self.transforms, self.moved):
            obs = np.ascontiguousarray(transform(np.asarray(transition["obs"])))
            key = (obs.tobytes(), int(moved[action]))
            if key in seen:
                continue
            seen.add(key)
            image = dict(
                transition,
                obs=obs,
                next_obs=np.ascontiguousarray(transform(np.asarray(transition["next_obs"]))),
                action=_like(transition["action"], int(moved[action])),
            )
            if "next_action_mask" in transition:
                image["next_action_mask"] = np.asarray(transition["next_action_mask"])[source]
            out.append(image)
        return out


def _like(value: Any, number: int) -> Any:
    """`number` in the type of `value` (a torch or numpy scalar)."""
    if isinstance(value, torch.Tensor):
        return torch.as_tensor(number, dtype=value.dtype)
    return np.asarray(number, dtype=np.asarray(value).dtype)


GAMES = {
    "tictactoe": lambda: BoardSymmetries(_dihedral(), np.arange(9).reshape(3, 3)),
    "connect_four": lambda: BoardSymmetries(_mirror(), np.arange(7).reshape(1, 7)),
}


def symmetries_for(game: Optional[str]) -> Optional[BoardSymmetries]:
    """The symmetries of a game named as the orchestrator names it (``classic/tictactoe-v3``,
    ``tictactoe_v3``); None for a game with none known here."""
    if not game:
        return None
    name = game.rsplit("/", 1)[-1].split("-v")[0].split("_v")[0]
    make = GAMES.get(name)
    return make() if make else None
