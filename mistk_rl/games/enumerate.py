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
from typing import TYPE_CHECKING, Any

from mistk_rl.errors import InvalidRequest
from mistk_rl.games.opponents import OPPONENTS
from mistk_rl.games.pettingzoo_games import GameCopy, make_copy, result_for, winner
from mistk_rl.schemas import ExhaustiveSpec

if TYPE_CHECKING:
    from orchestrators.game_orchestrator import GameOrchestrator


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


def check_exhaustive(orch: "GameOrchestrator", spec: ExhaustiveSpec) -> None:
    """Refuse (400) what cannot be enumerated: an unknown agent, a game that is not a
    two-seat turn-based one, an opponent that cannot play in its spaces."""
    if spec.agent not in orch.agents:
        raise InvalidRequest(f"exhaustive.agent {spec.agent!r} is not registered "
                             f"(registered: {', '.join(sorted(orch.agents)) or 'none'})")
    if orch.api != "aec" or len(orch.seats) != 2:
        raise InvalidRequest(f"exhaustive evaluation enumerates two-seat turn-based games; "
                             f"{orch.registry_id} is not one")
    for seat in orch.seats:
        try:
            OPPONENTS[spec.opponent].check_spaces(*orch.spaces[seat])
        except ValueError as exc:
            raise InvalidRequest(f"exhaustive.opponent {spec.opponent}: {exc}") from exc


def run_exhaustive(orch: "GameOrchestrator", spec: ExhaustiveSpec) -> dict[str, Any]:
    """Enumerate the games with the agent in each seat; returns the report (module doc)."""
    agent = orch.agents[spec.agent]
    opponent = OPPONENTS[spec.opponent](*orch.spaces[orch.seats[0]])
    report: dict[str, Any] = {"agent": spec.agent, "opponent": spec.opponent,
                              "game": orch.registry_id, "complete": True, "positions": 0,
                              "seats": {}}
    agent.client.episode_started({}, mode="eval", episode=len(orch.results))
    try:
        for seat in orch.seats:
            if orch.should_stop or not report["complete"]:
                break
            game = make_copy(orch.api, orch.registry_id, orch.kwargs)
            try:
                report["seats"][seat] = _enumerate_seat(orch, agent, opponent, game, seat,
                                                        spec.max_positions, report)
            finally:
                game.env.close()
    finally:
        agent.client.episode_stopped()
    if orch.should_stop:
        report["complete"] = False
    return report


def _enumerate_seat(orch: "GameOrchestrator", agent: Any, opponent: Any, game: GameCopy,
                    seat: str, max_positions: int, report: dict[str, Any]) -> dict[str, Any]:
    """The lines with the agent in `seat`, depth by depth: one request for all positions
    where it moves, a branch per opponent reply. Counts positions into `report` and marks
    it incomplete past `max_positions`."""
    tally = {"lines": 0, "wonLines": 0, "drawnLines": 0, "lostLines": 0,
             "win": 0.0, "draw": 0.0, "loss": 0.0}
    frontier = [_Node((), 1.0)]
    while frontier and not orch.should_stop:
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
            branched += [_Node(node.moves + ((decision.seat, reply),),
                               node.prob / len(replies)) for reply in replies]
        if report["positions"] > max_positions:
            report["complete"] = False
            break
        if asks:
            obs = {f"{seat}:{k}": d.obs for k, (_, d) in enumerate(asks)}
            masks = {f"{seat}:{k}": d.mask for k, (_, d) in enumerate(asks)
                     if d.mask is not None}
            actions = agent.client.get_action(obs, masks or None)
            branched += [_Node(node.moves + ((seat, actions.get(f"{seat}:{k}")),), node.prob)
                         for k, (node, _) in enumerate(asks)]
        frontier = branched
    return tally


def _count(tally: dict[str, Any], game: GameCopy, prob: float, seat: str) -> None:
    result = result_for(seat, winner(game.returns, game.illegal))
    tally["lines"] += 1
    tally[{"win": "wonLines", "draw": "drawnLines", "loss": "lostLines"}[result]] += 1
    tally[result] += prob
