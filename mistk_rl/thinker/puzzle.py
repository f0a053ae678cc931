"""A tiny copyable Sokoban: 7x7 room, one box, one target, two inner walls (gym id `ENV_ID`).

The Thinker's perfect model (wrapper_type 2) clones and restores the env at every imagined
step, so the whole state is five small ints (`PuzzleState`) and `step` draws no randomness.
Sokoban is the paper's test bed because a wrong push cannot be undone; this is the smallest
room that keeps that property and still fits a 2-core CPU budget.

Levels come from reverse play (the box starts on the target, the player walks and pulls it
away), are kept when the shortest forward solution (BFS) has at least `MIN_SOLUTION` moves,
and form a fixed pool per `pool_seed`. Rewards are Boxoban's; the 50-step cap lives in the
env, not in a TimeLimit wrapper, so `clone_state` captures the step count.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, NamedTuple, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "MistkPuzzle-v0"
SIZE = 7  # room side, the border included: a 5x5 interior
N_INNER_WALLS = 2
POOL_SIZE = 1500
MIN_SOLUTION = 3  # pool E of the reference notes; 7 (pool H) is too hard here
# Reverse-play moves per candidate, and how often a move pulls a box that is behind the player.
# Chosen to match the reference's pool E (median BFS length 5, random policy solves 14%):
# 20 moves gave 4 and 20%, 200 moves gave 6 and 9%.
REVERSE_STEPS = 60
PULL_PROB = 0.5
MAX_STEPS = 50

STEP_PENALTY = -0.01
BOX_ON = 1.0
BOX_OFF = -1.0
SOLVED = 10.0

ACTIONS = ("up", "down", "left", "right")
DELTAS = (-SIZE, SIZE, -1, 1)  # cell index = row * SIZE + col

INTERIOR = tuple(r * SIZE + c for r in range(1, SIZE - 1) for c in range(1, SIZE - 1))
BORDER = sum(
    1 << (r * SIZE + c)
    for r in range(SIZE)
    for c in range(SIZE)
    if r in (0, SIZE - 1) or c in (0, SIZE - 1)
)


class Level(NamedTuple):
    """A start position. `walls` is a bitmask over the SIZE*SIZE cells, border included."""

    walls: int
    target: int
    box: int
    player: int


class PuzzleState(NamedTuple):
    """Everything `step` reads: hashable, so a tree can key nodes by it."""

    walls: int
    target: int
    player: int
    box: int
    steps: int

    @property
    def solved(self) -> bool:
        return self.box == self.target


def is_wall(walls: int, cell: int) -> bool:
    return bool((walls >> cell) & 1)


def _bfs(walls: int, target: int, player: int, box: int) -> list[int] | None:
    """Shortest forward action sequence that puts the box on the target; None if none."""
    if box == target:
        return []
    start = (player, box)
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        p, b = state
        for action, d in enumerate(DELTAS):
            q = p + d
            if (walls >> q) & 1:
                continue
            if q == b:
                nb = b + d
                if (walls >> nb) & 1:
                    continue
                nxt = (q, nb)
            else:
                nxt = (q, b)
            if nxt in parent:
                continue
            parent[nxt] = (state, action)
            if nxt[1] == target:
                path = []
                link = parent[nxt]
                while link is not None:
                    path.append(link[1])
                    link = parent[link[0]]
                return path[::-1]
            frontier.append(nxt)
    return None


def solve(level: Level) -> list[int]:
    """The shortest action sequence that solves `level` (BFS over (player, box))."""
    path = _bfs(level.walls, level.target, level.player, level.box)
    if path is None:
        raise ValueError(f"level {level} has no solution")
    return path


def solver_action(state: PuzzleState) -> int | None:
    """The first move of a shortest solution from `state`; None when there is none left (the
    box is against a wall or in a corner it cannot leave, or already on the target)."""
    path = _bfs(state.walls, state.target, state.player, state.box)
    return path[0] if path else None


def _reverse_play(rng: np.random.Generator) -> Level:
    """One candidate: box on target, then REVERSE_STEPS random walks and pulls backwards.

    Each reverse move undoes a legal forward move (a pull undoes a push), so the result is
    solvable by construction; the BFS filter checks it anyway.
    """
    cells = rng.choice(len(INTERIOR), size=N_INNER_WALLS + 2, replace=False)
    walls = BORDER
    for i in cells[:N_INNER_WALLS]:
        walls |= 1 << INTERIOR[i]
    target = box = INTERIOR[cells[N_INNER_WALLS]]
    player = INTERIOR[cells[N_INNER_WALLS + 1]]
    directions = rng.integers(0, 4, size=REVERSE_STEPS)
    pulls = rng.random(REVERSE_STEPS) < PULL_PROB
    for a, pull in zip(directions.tolist(), pulls.tolist()):
        d = DELTAS[a]
        q = player + d
        if (walls >> q) & 1 or q == box:
            continue
        if pull and box == player - d:
            box = player
        player = q
    return Level(walls, target, box, player)


@functools.lru_cache(maxsize=8)
def level_pool(pool_seed: int = 0, size: int = POOL_SIZE) -> tuple[Level, ...]:
    """The first `size` kept levels of seed `pool_seed` (a prefix of any larger pool)."""
    rng = np.random.default_rng(pool_seed)
    levels: list[Level] = []
    while len(levels) < size:
        level = _reverse_play(rng)
        path = _bfs(level.walls, level.target, level.player, level.box)
        if path is not None and len(path) >= MIN_SOLUTION:
            levels.append(level)
    return tuple(levels)


class PuzzleEnv(gym.Env[np.ndarray, int | np.int64]):
    """The puzzle as a gymnasium env, with `clone_state()` / `restore_state(s)`.

    Observation: uint8 planes (walls, target, box, player) of shape (4, 7, 7), values 0/1, and
    declared as Box(0, 1). The bound is what the data is: the project's `make_encoder` treats
    only Box(0, 255) uint8 as an image (dividing by 255), so 0/1 planes declared 0..255 would
    reach a CNN as values of 0.004. Declared 0..1 they go to the flat MLP unscaled, which is
    ample for 196 binary inputs; an agent that wants a CNN can scale the planes itself.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        render_mode: str | None = None,
        pool_seed: int = 0,
        pool_size: int = POOL_SIZE,
        max_steps: int = MAX_STEPS,
        levels: Sequence[Level] | None = None,
        in_order: bool = False,
    ) -> None:
        self.render_mode = render_mode
        # in_order: each reset plays the next level of the list (then the first again), so
        # an evaluation can play a whole pool once, split over env copies
        self.in_order = in_order
        self._next_level = 0
        self.levels: Sequence[Level] = (
            levels if levels is not None else level_pool(pool_seed, pool_size)
        )
        self.max_steps = max_steps
        self.observation_space = spaces.Box(0, 1, (4, SIZE, SIZE), np.uint8)
        self.action_space = spaces.Discrete(len(ACTIONS))
        self._s: PuzzleState | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "level" in options:
            index = int(options["level"])
        elif self.in_order:
            index, self._next_level = self._next_level, (self._next_level + 1) % len(self.levels)
        else:
            index = int(self.np_random.integers(len(self.levels)))
        level = self.levels[index]
        self._s = PuzzleState(level.walls, level.target, level.player, level.box, 0)
        return self._obs(), {"level": index}

    def step(self, action: int | np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._s is None:
            raise RuntimeError("call reset() before step()")
        walls, target, player, box, steps = self._s
        d = DELTAS[int(action)]
        reward = STEP_PENALTY
        q = player + d
        if not (walls >> q) & 1:
            if q != box:
                player = q
            elif not (walls >> (box + d)) & 1:
                was_on = box == target
                player, box = q, box + d
                if box == target:
                    reward += BOX_ON + SOLVED
                elif was_on:  # only after termination, or from a restored solved state
                    reward += BOX_OFF
        steps += 1
        self._s = PuzzleState(walls, target, player, box, steps)
        # TimeLimit's convention: truncated says the cap was reached, whatever terminated says.
        return self._obs(), reward, box == target, steps >= self.max_steps, {}

    def clone_state(self) -> PuzzleState:
        if self._s is None:
            raise RuntimeError("call reset() before clone_state()")
        return self._s

    def restore_state(self, state: PuzzleState) -> None:
        self._s = PuzzleState(*state)

    def _obs(self) -> np.ndarray:
        assert self._s is not None  # (reset and step set it first)
        walls, target, player, box, _ = self._s
        obs = np.zeros((4, SIZE * SIZE), np.uint8)
        obs[0] = _wall_plane(walls)
        obs[1, target] = 1
        obs[2, box] = 1
        obs[3, player] = 1
        return obs.reshape(4, SIZE, SIZE)

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._s is None:
            return None
        walls, target, player, box, _ = self._s
        chars = []
        for cell in range(SIZE * SIZE):
            if is_wall(walls, cell):
                ch = "#"
            elif cell == box:
                ch = "*" if cell == target else "B"
            elif cell == player:
                ch = "+" if cell == target else "@"
            else:
                ch = "T" if cell == target else "."
            chars.append(ch + ("\n" if cell % SIZE == SIZE - 1 else ""))
        return "".join(chars)


@functools.lru_cache(maxsize=4096)
def _wall_plane(walls: int) -> np.ndarray:
    plane = np.array([(walls >> c) & 1 for c in range(SIZE * SIZE)], np.uint8)
    plane.flags.writeable = False
    return plane


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point="mistk_rl.thinker.puzzle:PuzzleEnv", max_episode_steps=None)
