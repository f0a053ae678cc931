"""Search for two-player games on bitboards: depth-limited alpha-beta (negamax) and Monte-Carlo
tree search with random rollouts (UCT), for the opponents that are strong without learning.

A position is ``(own, other)``: the bit masks of the pieces of the player to move and of the
other player, as the game's `Rules` lay them out; playing a move gives the mover's new mask,
and the two swap roles. Both searches score positions for the player to move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Protocol

import numpy as np

WIN = 1000.0  # a won position's value, plus the plies left (a quicker win is worth more)
TIES = 1e-9  # root moves within this of the best one count as equally good


class Rules(Protocol):
    """A two-player game on bitboards (`mistk_rl.games.tictactoe`, `connect_four`)."""

    def moves(self, own: int, other: int) -> list[int]:
        """The legal moves, best-first guesses first (what alpha-beta tries first)."""

    def play(self, own: int, other: int, move: int) -> int:
        """The mover's mask once it has played `move`."""

    def won(self, marks: int) -> bool:
        """Whether these pieces hold a winning line."""

    def heuristic(self, own: int, other: int) -> float:
        """A guess at the value, for the player to move, of an undecided position where the
        search stops; well inside (-WIN, WIN)."""


def _negamax(rules: Rules, own: int, other: int, depth: int, alpha: float, beta: float) -> float:
    if rules.won(other):  # the player who just moved won
        return -(WIN + depth)
    moves = rules.moves(own, other)
    if not moves:
        return 0.0  # a full board: drawn
    if depth == 0:
        return rules.heuristic(own, other)
    best = -math.inf
    for move in moves:
        value = -_negamax(rules, other, rules.play(own, other, move), depth - 1, -beta, -alpha)
        if value > best:
            best = value
            if value > alpha:
                alpha = value
                if alpha >= beta:
                    break
    return best


def alphabeta_moves(rules: Rules, own: int, other: int, depth: int) -> list[int]:
    """Every legal move whose value, searched `depth` plies deep (this move the first), is
    the best one's. Each root move is searched with the window the best so far allows, so a
    worse one is cut as soon as it is known to be worse; the ties are exact."""
    if depth < 1:
        raise ValueError(f"search depth {depth}: at least 1")
    values: dict[int, float] = {}
    best = -math.inf
    for move in rules.moves(own, other):
        floor = best - TIES  # (-inf until one move is searched)
        values[move] = -_negamax(
            rules, other, rules.play(own, other, move), depth - 1, -math.inf, -floor
        )
        best = max(best, values[move])
    return [move for move, value in values.items() if value >= best - TIES]


@dataclass
class _Node:
    """A position in the tree, seen by the player to move there; `wins` counts, over the
    visits, the results for the player who moved into it (1 a win, 0.5 a draw)."""

    own: int
    other: int
    untried: list[int]
    terminal: Optional[float]  # for the player to move: 0 lost, 0.5 drawn; None: open
    children: dict[int, "_Node"] = field(default_factory=dict)
    visits: int = 0
    wins: float = 0.0


def _node(rules: Rules, own: int, other: int, rng: np.random.Generator) -> _Node:
    if rules.won(other):
        return _Node(own, other, [], 0.0)
    moves = rules.moves(own, other)
    if not moves:
        return _Node(own, other, [], 0.5)
    return _Node(own, other, [int(m) for m in rng.permutation(moves)], None)


def _rollout(rules: Rules, own: int, other: int, rng: np.random.Generator) -> float:
    """A uniformly random game from here: its result for the player to move now."""
    turn = 0  # 0: the player to move now
    while True:
        if rules.won(other):
            return 0.0 if turn == 0 else 1.0  # the player who just moved won
        moves = rules.moves(own, other)
        if not moves:
            return 0.5
        own, other = other, rules.play(own, other, moves[rng.integers(len(moves))])
        turn ^= 1


def mcts_move(
    rules: Rules,
    own: int,
    other: int,
    simulations: int,
    rng: np.random.Generator,
    exploration: float = math.sqrt(2),
) -> int:
    """UCT: `simulations` times, descend by the upper confidence bound, add one position,
    finish the game at random, and count its result along the way down; the move visited
    most. A win in one is taken at once (a rollout there always wins; visits would find it,
    at a cost)."""
    root = _node(rules, own, other, rng)
    if root.terminal is not None:
        raise ValueError("the game is over: no move to search")
    for move in root.untried:
        if rules.won(rules.play(own, other, move)):
            return move
    for _ in range(simulations):
        node, path = root, [root]
        while not node.untried and node.terminal is None:  # select
            log_n = math.log(node.visits)
            node = max(
                node.children.values(),
                key=lambda c: c.wins / c.visits + exploration * math.sqrt(log_n / c.visits),
            )
            path.append(node)
        if node.terminal is None:  # expand
            move = node.untried.pop()
            child = _node(rules, node.other, rules.play(node.own, node.other, move), rng)
            node.children[move] = child
            node = child
            path.append(node)
        # the result for the player to move at `node`, then for each mover on the way up
        result = (
            node.terminal
            if node.terminal is not None
            else _rollout(rules, node.own, node.other, rng)
        )
        for visited in reversed(path):
            visited.visits += 1
            visited.wins += 1.0 - result  # (for the player who moved into it)
            result = 1.0 - result
    return max(root.children.items(), key=lambda item: item[1].visits)[0]
