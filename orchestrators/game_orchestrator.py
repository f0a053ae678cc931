"""GameOrchestrator: agent services play PettingZoo games against each other, or themselves.

initialize names the game (``classic/tictactoe-v3``, ``classic/connect_four-v3``,
``classic/rps-v2``, or the module spelling ``tictactoe_v3``); its seats come from the env.
registerAgent binds seats to agents (``seats=player_1,player_2``: one agent plays both sides);
each agent is told its seats' observation and action spaces. One startEpisode plays
``numEpisodes`` games (or games until ``numSteps`` moves) on ``numEnvs`` game copies side by
side. Each round, every agent gets one request carrying all of its seats that must move now,
entity ``SEAT:COPY``, with their action masks, so it answers with one forward pass.

A seat's transition runs from one of its decisions to its next one, or to the end of the
game: both seats of a finished game get a terminal transition with their final reward
(the loser's last move is followed by the winner's), and each transition carries the legal
moves of its next state (all zeros at the end). Agents that train get their transitions in
their next request (the ``step`` operation) or in a replayAction at the end.

Per game the results record the winner (or a draw), each seat's return and holder, the length
and illegal moves; `totals` sums wins, draws and losses per agent and seat. With
``exhaustive`` the call enumerates games instead of sampling them (`mistk_rl.games.enumerate`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.implementation import PROGRESS_EVERY_S
from mistk_rl.framework.orchestrator import AbstractOrchestrator, episode_quotas
from mistk_rl.games.enumerate import check_enumerable, enumerate_lines
from mistk_rl.games.opponents import OPPONENTS
from mistk_rl.games.pettingzoo_games import (
    RESULTS,
    Decision,
    GameCopy,
    GameInfo,
    SeatOutcome,
    check_lineup,
    make_copy,
    probe_game,
    result_for,
    winner,
)
from mistk_rl.sdk.client import ServiceError, ServiceUnavailable
from mistk_rl.sdk.schemas import EpisodeSettings, ExhaustiveSpec, GameEpisodeSettings
from mistk_rl.sdk.stepping import replay_batch
from mistk_rl.spaces import space_to_dict


@dataclass
class _Move:
    """A seat's last move, waiting for its outcome to become a transition."""

    agent: str
    obs: np.ndarray
    action: int


@dataclass
class _Game:
    """One copy's game in progress: who holds which seat, and the moves awaiting outcomes."""

    holders: dict[str, str]
    seed: Optional[int]
    moves: dict[str, _Move] = field(default_factory=dict)


class GameOrchestrator(AbstractOrchestrator):
    episode_settings = GameEpisodeSettings

    def __init__(self) -> None:
        super().__init__()
        self.api = "aec"
        self.registry_id = ""
        self.kwargs: dict[str, Any] = {}
        self.seats: list[str] = []
        self.spaces: dict[str, tuple[Any, Any]] = {}
        self.copies: list[GameCopy] = []  # kept across calls: making an env costs ~1 ms
        self.totals: dict[str, dict[str, dict[str, float]]] = {}
        self.evaluations: list[dict[str, Any]] = []
        self.moves_by_agent: dict[str, int] = {}

    # ---- initialize and registration -----------------------------------------------------
    def validate_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        super().validate_initialize(env, agents_needed)
        probe_game(env)  # (more agents than seats is fine: the others wait for a lineup)

    def do_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        self.api, self.registry_id, self.seats, self.spaces = probe_game(env)
        self.kwargs = dict(env.get("kwargs", {}))
        self.copies = []
        self.totals, self.evaluations, self.moves_by_agent = {}, [], {}
        self.update_status({"game": self.registry_id, "seats": list(self.seats)})

    def validate_register_agent(
        self, name: str, seats: tuple[str, ...], skip_train: bool = False
    ) -> tuple[str, ...]:
        bound = {seat for agent in self.agents.values() for seat in agent.seats}
        free = [seat for seat in self.seats if seat not in bound]
        if not seats:  # one agent: every seat; else the next free one
            seats = tuple(free) if self.agents_needed == 1 else tuple(free[:1])
        unknown = [seat for seat in seats if seat not in self.seats]
        if unknown:
            raise InvalidRequest(
                f"seats {', '.join(unknown)}: {self.registry_id} has seats {', '.join(self.seats)}"
            )
        taken = [seat for seat in seats if seat in bound]
        if taken or len(set(seats)) != len(seats):
            raise InvalidRequest(
                f"seats {', '.join(seats)}: each seat is held by one agent "
                f"(free now: {', '.join(free) or 'none'})"
            )
        if len({_space_key(self.spaces[seat]) for seat in seats or self.seats}) > 1:
            raise InvalidRequest(
                f"seats {', '.join(seats or self.seats)} have different "
                "spaces: one agent holds seats of one observation and "
                "action space"
            )
        left = [seat for seat in free if seat not in seats]
        if len(self.agents) + 1 == self.agents_needed and left:
            raise InvalidRequest(
                f"the last agent must leave no seat empty: {', '.join(left)} would be"
            )
        return seats

    def do_register_agent(self, agent_name: str, agent_url: str, skip_train: bool) -> None:
        # who holds which seat, as bound here (a seat left out of registerAgent is the next
        # free one): a caller sees whom the agents meet in games without a lineup
        self.update_status(
            {
                "seatHolders": {
                    seat: agent.name for agent in self.agents.values() for seat in agent.seats
                }
            }
        )

    def agent_config(self, name: str, seats: tuple[str, ...] = ()) -> dict[str, Any]:
        """Its seats' spaces; an agent holding none (an opponent on the bench, for lineups
        of later calls) gets those every seat shares."""
        obs_space, act_space = self._spaces_of(seats)
        return {
            "observationSpace": space_to_dict(obs_space),
            "actionSpace": space_to_dict(act_space),
            "properties": {"game": self.registry_id, "seats": list(seats)},
        }

    def _spaces_of(self, seats: tuple[str, ...]) -> tuple[Any, Any]:
        """The spaces an agent holding `seats` was told (no seat: those all seats share)."""
        return self.spaces[(seats or self.seats)[0]]

    # ---- episodes ------------------------------------------------------------------------
    def validate_start_episode(self, config: EpisodeSettings) -> None:
        assert isinstance(config, GameEpisodeSettings)  # (the service parses `episode_settings`)
        # (games run in-process and end by their own rules: no maxSteps, envManager or
        # resume here; cap them with the env's max_cycles kwarg where it has one)
        if config.lineup is not None:
            self._check_lineup(config.lineup)
        if config.exhaustive is not None:
            check_enumerable(
                self._game(), config.exhaustive.agent, config.exhaustive.opponent, self.agents
            )

    def _run_exhaustive(self, spec: ExhaustiveSpec) -> dict[str, Any]:
        """Every game of the agent (greedy) against every reply of the opponent, in each
        seat (`mistk_rl.games.enumerate`), as one eval episode of the agent."""
        agent = self.agents[spec.agent]
        opponent = OPPONENTS[spec.opponent](*self.spaces[self.seats[0]])
        agent.client.episode_started({}, mode="eval", episode=len(self.results))
        try:
            report = enumerate_lines(
                self.api,
                self.registry_id,
                self.kwargs,
                self.seats,
                opponent,
                agent.client.get_action,
                spec.max_positions,
                lambda: self.should_stop,
            )
        finally:
            agent.client.episode_stopped()
        return {"agent": spec.agent, "opponent": spec.opponent, **report}

    def _game(self) -> GameInfo:
        return GameInfo(self.api, self.registry_id, self.seats, self.spaces)

    def _check_lineup(self, lineup: dict[str, str]) -> None:
        check_lineup(self._game(), lineup, self.agents)
        for seat, name in lineup.items():
            agent = self.agents[name]
            if _space_key(self._spaces_of(agent.seats)) != _space_key(self.spaces[seat]):
                raise InvalidRequest(
                    f"lineup[{seat!r}]: {name!r} was registered for other spaces than this seat's"
                )

    def do_start_episode(self, config: EpisodeSettings) -> None:
        assert isinstance(config, GameEpisodeSettings)  # (the service parses `episode_settings`)
        if config.exhaustive is not None:
            self.evaluations.append(self._run_exhaustive(config.exhaustive))
            self.update_status({"lastEvaluation": self.evaluations[-1]})
            return
        _Match(self, config).play()

    def extra_results(self) -> dict[str, Any]:
        return {"totals": self._totals(), "evaluations": list(self.evaluations)}

    def report(self, every_s: float = 0.0) -> None:
        """Moves, moves per agent and the totals into status (copies: status is read from
        other threads while games go on)."""
        self.update_status(
            {
                "envSteps": self.env_steps,
                "agentSteps": dict(self.moves_by_agent),
                "games": self._totals(),
            },
            every_s,
        )

    def _totals(self) -> dict[str, dict[str, dict[str, float]]]:
        return {
            agent: {seat: dict(tally) for seat, tally in seats.items()}
            for agent, seats in self.totals.items()
        }

    def do_reset(self) -> None:
        self._close()

    def do_terminate(self) -> None:
        self._close()

    def _close(self) -> None:
        copies, self.copies = self.copies, []
        for copy in copies:
            copy.env.close()

    def copies_for(self, n: int) -> list[GameCopy]:
        while len(self.copies) < n:
            self.copies.append(make_copy(self.api, self.registry_id, self.kwargs))
        return self.copies[:n]

    def holders(
        self, config: GameEpisodeSettings, game: int, rng: np.random.Generator
    ) -> dict[str, str]:
        """seat -> agent for the `game`-th game of this call: the registered binding
        (fixed), rotated by one seat per game (alternate), or a random permutation."""
        base = config.lineup or {
            seat: agent.name for agent in self.agents.values() for seat in agent.seats
        }
        owners = [base[seat] for seat in self.seats]
        if config.seat_assignment == "alternate":
            shift = game % len(owners)
            owners = owners[shift:] + owners[:shift]
        elif config.seat_assignment == "random":
            owners = [owners[i] for i in rng.permutation(len(owners))]
        return dict(zip(self.seats, owners))

    def record_game(self, copy: GameCopy, game: _Game, index: int, trained: set[str]) -> None:
        """The finished game into the results and the totals per agent and seat."""
        won = winner(copy.returns, copy.illegal)
        first = self.seats[0]
        for seat, agent in game.holders.items():
            tally = self.totals.setdefault(agent, {}).setdefault(
                seat, {"games": 0, **dict.fromkeys(RESULTS, 0), "illegal": 0, "return": 0.0}
            )
            tally["games"] += 1
            tally[result_for(seat, won)] += 1
            tally["illegal"] += copy.illegal[seat]
            tally["return"] += copy.returns[seat]
        self.record_episode(
            game.holders[first],
            copy.returns[first],
            copy.length,
            seed=game.seed,
            terminated=copy.terminated,
            truncated=copy.truncated,
            envIndex=index,
            train=bool(trained & set(game.holders.values())),
            seats=dict(game.holders),
            returns=dict(copy.returns),
            winner=won,
            illegal=dict(copy.illegal),
        )


class _Match:
    """One startEpisode call of sampled games (the module doc says how it plays)."""

    def __init__(self, orch: GameOrchestrator, config: GameEpisodeSettings) -> None:
        self.orch, self.config = orch, config
        playing = (
            set(config.lineup.values())
            if config.lineup
            else {agent.name for agent in orch.agents.values() if agent.seats}
        )
        self.settings = {
            name: orch.play_settings(config, orch.agents[name]) for name in sorted(playing)
        }
        self.trained = {name for name, (_, train) in self.settings.items() if train}
        self.copies = orch.copies_for(config.num_envs)
        self.rng = np.random.default_rng(config.seed)
        self.games: dict[int, _Game] = {}  # copy -> its game now (from its first)
        self.started = 0
        self.moves = 0
        self.replay: dict[str, dict[str, dict]] = {name: {} for name in self.settings}

    def play(self) -> None:
        orch, config = self.orch, self.config
        quotas = episode_quotas(config.episode_limit(), len(self.copies))
        finished = [0] * len(self.copies)
        active = {i for i in range(len(self.copies)) if quotas[i] > 0}
        for i in active:
            self._new_game(i)
        for name, (mode, _) in self.settings.items():
            orch.agents[name].client.episode_started(
                {},
                mode=mode,
                episode=len(orch.results),
                epsilon=orch.exploration(self.config, orch.agents[name]),
            )
        try:
            while active and not orch.should_stop:
                asks: dict[str, dict[str, tuple[int, Decision]]] = {}  # agent -> entity ->
                for i in sorted(active):
                    decisions = self._advance(i)
                    while self.copies[i].over:
                        orch.record_game(self.copies[i], self.games[i], i, self.trained)
                        finished[i] += 1
                        spent = config.num_steps is not None and self.moves >= config.num_steps
                        if spent or finished[i] >= quotas[i]:
                            active.discard(i)
                            break
                        self._new_game(i)
                        decisions = self._advance(i)
                    for decision in decisions if i in active else ():
                        agent = self.games[i].holders[decision.seat]
                        asks.setdefault(agent, {})[f"{decision.seat}:{i}"] = (i, decision)
                self._play_moves(asks)
                orch.report(every_s=PROGRESS_EVERY_S)
            for name, replay in self.replay.items():  # the last transitions, if any
                if replay:
                    orch.agents[name].client.replay_action(replay_batch(replay))
        finally:
            orch.report()
            ending = sys.exc_info()[1]
            if not isinstance(ending, ServiceUnavailable):
                for name in self.settings:
                    try:
                        orch.agents[name].client.episode_stopped()
                    except ServiceError:
                        if ending is None:
                            raise

    def _new_game(self, i: int) -> None:
        seed = None
        if self.config.seed is not None and i not in self.games:  # a copy's first game
            seed = self.config.seed + i
        self.games[i] = _Game(self.orch.holders(self.config, self.started, self.rng), seed)
        self.started += 1
        self.copies[i].reset(seed)

    def _advance(self, i: int) -> list[Decision]:
        """The copy's outcomes become transitions of the seats that moved; returns the
        seats that must move now."""
        outcomes, decisions = self.copies[i].advance()
        game = self.games[i]
        for outcome in outcomes:
            move = game.moves.pop(outcome.seat, None)
            if move is not None and move.agent in self.trained:
                self.replay[move.agent][f"{outcome.seat}:{i}"] = _transition(move, outcome)
        return decisions

    def _play_moves(self, asks: dict[str, dict[str, tuple[int, Decision]]]) -> None:
        """One request per agent for all its seats that must move; then the moves, copy
        by copy (a parallel game's seats all at once)."""
        orch = self.orch
        moves: dict[int, dict[str, Any]] = {}
        for name, entities in asks.items():
            agent = orch.agents[name]
            obs = {entity: d.obs for entity, (_, d) in entities.items()}
            masks = {entity: d.mask for entity, (_, d) in entities.items() if d.mask is not None}
            replay, self.replay[name] = self.replay[name], {}
            actions = orch.act(agent, obs, replay, masks or None)
            for entity, (i, decision) in entities.items():
                action = actions.get(entity)
                moves.setdefault(i, {})[decision.seat] = action
                if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
                    self.games[i].moves[decision.seat] = _Move(name, decision.obs, int(action))
            orch.moves_by_agent[name] = orch.moves_by_agent.get(name, 0) + len(entities)
        for i, seat_actions in moves.items():
            self.copies[i].act(seat_actions)
            self.moves += len(seat_actions)
            orch.env_steps += len(seat_actions)


def _transition(move: _Move, outcome: SeatOutcome) -> dict[str, Any]:
    entry = {
        "prevObs": move.obs,
        "actions": move.action,
        "rewards": outcome.reward,
        "newObs": outcome.obs,
        "terminated": outcome.terminated,
        "truncated": outcome.truncated and not outcome.terminated,
    }
    if outcome.mask is not None:
        entry["newActionMask"] = (
            np.zeros_like(outcome.mask) if outcome.terminated or outcome.truncated else outcome.mask
        )
    return entry


def _space_key(pair: tuple[Any, Any]) -> str:
    return repr((space_to_dict(pair[0]), space_to_dict(pair[1])))
