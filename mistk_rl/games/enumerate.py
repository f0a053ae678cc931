"""Exhaustive evaluation: every game of an agent (greedy, deterministic) against all the
replies of a built-in opponent, enumerated instead of sampled.

The agent is asked once per position it meets, all positions of one depth in one request;
at the opponent's turn the game branches into each of its replies (`Opponent.replies`),
each with probability 1/len(replies). The leaves are the lines: reported per seat of the
agent are the lines, won / drawn / lost lines, and the probability of each result (against
`random`: the exact expectation against a uniformly random player; against `random`'s lines
unweighted: "against any reply"). For tic-tac-toe the trees are small (vs all optimal replies
of the perfect player: a few lines; vs every legal reply: hundreds); `max_positions` bounds
the work for bigger games.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import numpy as np

from mistk_rl.errors import InvalidRequest
from mistk_rl.games.opponents import OPPONENTS, Opponent
from mistk_rl.games.pettingzoo_games import GameCopy, GameInfo, make_copy, result_for, winner

# the agent's greedy actions for a batch of positions: ({entity: obs}, {entity: mask} or None)
# -> {entity: action}; entities are "SEAT:k", one per position (the orchestrator asks its
# agent over HTTP; a test may answer in-process)
Ask = Callable[[dict[str, np.ndarray], Optional[dict[str, np.ndarray]]], dict[str, Any]]


@dataclass
class _Node:
    """A position, as the moves that lead to it (PettingZoo envs cannot be deep-copied:
    their pickling rebuilds them from the constructor's arguments, losing the board)."""

    moves: tuple[tuple[str, Any], ...]
    prob: float


def _position(game: GameCopy, node: _Node) -> list:
    """Play `node`'s moves on `game` from the start; returns the decisions there."""
    game.reset()
    _, decisions = game.advance()
    for seat, action in node.moves:
        game.act({seat: action})
        _, decisions = game.advance()
    return decisions


def check_enumerable(game: GameInfo, agent: str, opponent: str, registered: Iterable[str]) -> None:
    """InvalidRequest unless `agent`'s games against `opponent` can be enumerated: the agent
    is registered, the game is a two-seat turn-based one, the opponent plays its spaces."""
    known = sorted(registered)
    if agent not in known:
        raise InvalidRequest(
            f"exhaustive.agent {agent!r} is not registered "
            f"(registered: {', '.join(known) or 'none'})"
        )
    if game.api != "aec" or len(game.seats) != 2:
        raise InvalidRequest(
            f"exhaustive evaluation enumerates two-seat turn-based games; "
            f"{game.registry_id} is not one"
        )
    if not OPPONENTS[opponent].enumerable:
        raise InvalidRequest(
            f"exhaustive.opponent {opponent} searches with chance (its moves are not a set to "
            "enumerate): play it in sampled games instead"
        )
    for seat in game.seats:
        try:
            OPPONENTS[opponent].check_spaces(*game.spaces[seat])
        except ValueError as exc:
            raise InvalidRequest(f"exhaustive.opponent {opponent}: {exc}") from exc


def enumerate_lines(
    api: str,
    registry_id: str,
    kwargs: dict[str, Any],
    seats: list[str],
    opponent: Opponent,
    ask: Ask,
    max_positions: int,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Enumerate the games with the agent in each seat of a two-seat turn-based game against
    every reply of `opponent`; returns the report (module doc) without its agent and
    opponent names, which the caller knows."""
    report: dict[str, Any] = {"game": registry_id, "complete": True, "positions": 0, "seats": {}}
    for seat in seats:
        if should_stop() or not report["complete"]:
            break
        game = make_copy(api, registry_id, kwargs)
        try:
            report["seats"][seat] = _enumerate_seat(
                ask, opponent, game, seat, max_positions, report, should_stop
            )
        finally:
            game.env.close()
    if should_stop():
        report["complete"] = False
    return report


def _enumerate_seat(
    ask: Ask,
    opponent: Opponent,
    game: GameCopy,
    seat: str,
    max_positions: int,
    report: dict[str, Any],
    should_stop: Callable[[], bool],
) -> dict[str, Any]:
    """The lines with the agent in `seat`, depth by depth: one request for all positions
    where it moves, a branch per opponent reply. Counts positions into `report` and marks
    it incomplete past `max_positions`."""
    tally = {
        "lines": 0,
        "wonLines": 0,
        "drawnLines": 0,
        "lostLines": 0,
        "win": 0.0,
        "draw": 0.0,
        "loss": 0.0,
    }
    frontier = [_Node((), 1.0)]
    while frontier and not should_stop():
        asks: list[tuple[_Node, Any]] = []
        branched: list[_Node] = []
        for node in frontier:
            report["positions"] += 1
            decisions = _position(game, node)
            if game.over:
                _count(tally, game, node.prob, seat)
                continue
            (decision,) = decisions
            if decision.seat == seat:
                asks.append((node, decision))
                continue
            replies = opponent.replies(decision.obs, decision.mask)
            branched += [
                _Node(node.moves + ((decision.seat, reply),), node.prob / len(replies))
                for reply in replies
            ]
        if report["positions"] > max_positions:
            report["complete"] = False
            break
        if asks:
            obs = {f"{seat}:{k}": d.obs for k, (_, d) in enumerate(asks)}
            masks = {f"{seat}:{k}": d.mask for k, (_, d) in enumerate(asks) if d.mask is not None}
            actions = ask(obs, masks or None)
            branched += [
                _Node(node.moves + ((seat, actions.get(f"{seat}:{k}")),), node.prob)
                for k, (node, _) in enumerate(asks)
            ]
        frontier = branched
    return tally


def _count(tally: dict[str, Any], game: GameCopy, prob: float, seat: str) -> None:
    result = result_for(seat, winner(game.returns, game.illegal))
    tally["lines"] += 1
    tally[{"win": "wonLines", "draw": "drawnLines", "loss": "lostLines"}[result]] += 1
    tally[result] += prob
