"""PettingZoo games as the game orchestrator plays them.

A `GameCopy` is one PettingZoo env seen seat by seat: `advance` says which seats must move
now (`Decision`: observation and action mask) and what happened to seats since they last
moved (`SeatOutcome`: the reward collected meanwhile and where they are now), `act` plays the
moves. Turn-based games go through PettingZoo's AEC API, one seat at a time; games whose
metadata says they are parallelizable (rock-paper-scissors) through the parallel API, every
seat at once. The orchestrator pairs each SeatOutcome with the seat's last move: that is the
seat's transition, from one decision to its next one or to the end of the game.

PettingZoo puts legal moves in the observation (``{"observation", "action_mask"}``); here the
mask is split off, so an agent's observation is the ``observation`` array and the mask
travels beside it, as the agent API's actionMask.
"""

from __future__ import annotations

import re
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.spaces import SUPPORTED

MASK_KEY, OBS_KEY = "action_mask", "observation"
ILLEGAL_REWARD = -1.0  # the mover's reward for an illegal move, as PettingZoo's classic games


@dataclass
class Decision:
    """A seat that must move now."""

    seat: str
    obs: np.ndarray
    mask: Optional[np.ndarray]  # legal moves (None: the game has no masks)


@dataclass
class SeatOutcome:
    """What happened to a seat since its last move: the reward collected meanwhile and its
    observation now (the game's last one when it ended)."""

    seat: str
    reward: float
    obs: np.ndarray
    mask: Optional[np.ndarray]
    terminated: bool
    truncated: bool


class GameError(ValueError):
    """The env id or kwargs do not make a game this orchestrator can play."""


def resolve_id(env_id: str) -> tuple[str, str]:
    """("aec" | "parallel", registry id) for `env_id`: a registry id such as
    ``classic/tictactoe-v3``, or the module spelling ``tictactoe_v3``. Parallelizable games
    (simultaneous moves) use the parallel API."""
    from pettingzoo.env_registry.registration import aec_registry, parallel_registry

    found = env_id if env_id in aec_registry else None
    module_style = re.fullmatch(r"(\w+)_v(\d+)", env_id)
    if found is None and module_style:
        suffix = f"/{module_style[1]}-v{module_style[2]}"
        matches = [key for key in aec_registry if key.endswith(suffix)]
        found = matches[0] if len(matches) == 1 else None
    if found is None:
        raise GameError(
            f"{env_id!r} is not a PettingZoo env id (e.g. classic/tictactoe-v3, "
            "classic/connect_four-v3, classic/rps-v2)"
        )
    parallel = found in parallel_registry and bool(
        make_env("aec", found, {}).metadata.get("is_parallelizable", False)
    )
    return ("parallel" if parallel else "aec"), found


def make_env(api: str, registry_id: str, kwargs: dict[str, Any]) -> Any:
    """The PettingZoo env; its constructor's errors become GameError."""
    import pettingzoo

    try:
        with warnings.catch_warnings():  # (a deprecation notice some games print on import)
            warnings.simplefilter("ignore", DeprecationWarning)
            return pettingzoo.make(api, registry_id, **kwargs)
    except Exception as exc:
        raise GameError(
            f"{registry_id} cannot be made with kwargs {kwargs}: {type(exc).__name__}: {exc}"
        ) from exc


def seat_spaces(env: Any) -> dict[str, tuple[spaces.Space, spaces.Space]]:
    """(observation, action) space of each seat as an agent sees it: a dict observation with
    an action mask is its ``observation`` part (the mask goes beside it)."""
    out: dict[str, tuple[spaces.Space, spaces.Space]] = {}
    for seat in env.possible_agents:
        obs_space, act_space = env.observation_space(seat), env.action_space(seat)
        if isinstance(obs_space, spaces.Dict) and MASK_KEY in obs_space.spaces:
            if set(obs_space.spaces) != {MASK_KEY, OBS_KEY}:
                raise GameError(
                    f"seat {seat}: a dict observation other than "
                    f"{{{OBS_KEY}, {MASK_KEY}}}: {obs_space}"
                )
            obs_space = obs_space[OBS_KEY]
        if not isinstance(act_space, spaces.Discrete):
            raise GameError(f"seat {seat}: action space {act_space} is not Discrete")
        out[seat] = (obs_space, act_space)
    return out


class GameInfo(NamedTuple):
    """What `probe_game` found: the API a game is played through, its registry id, its
    seats (in the env's order) and each seat's (observation, action) space."""

    api: str
    registry_id: str
    seats: list[str]
    spaces: dict[str, tuple[spaces.Space, spaces.Space]]


def probe_game(env: dict[str, Any]) -> GameInfo:
    """The game `env` names (``{"id": ..., "kwargs": {...}}``), from one instance made and
    closed. Raises `mistk_rl.errors.InvalidRequest` (a 400 for a service's caller) when it is
    no game an orchestrator can play: an unknown id, kwargs its constructor refuses, an
    action space other than Discrete, an observation space `mistk_rl.spaces` cannot carry.
    Orchestrators that serve games (the game orchestrator, the league) check initialize with
    it and take their seats and spaces from it."""
    try:
        api, registry_id = resolve_id(env["id"])
        game = make_env(api, registry_id, env.get("kwargs", {}))
        try:
            found = seat_spaces(game)
        finally:
            game.close()
    except GameError as exc:
        raise InvalidRequest(str(exc)) from exc
    for seat, (obs_space, _) in found.items():
        if not isinstance(obs_space, SUPPORTED):
            raise InvalidRequest(
                f"{registry_id} seat {seat}: observation space {obs_space} "
                "is not supported: Box, Discrete, MultiDiscrete or "
                "MultiBinary (or a dict of observation and action_mask)"
            )
    return GameInfo(api, registry_id, list(found), found)


def check_lineup(game: GameInfo, lineup: dict[str, str], registered: Iterable[str]) -> None:
    """InvalidRequest unless `lineup` (seat -> agent) names each of the game's seats once,
    each with a registered agent: what a game call's ``lineup`` must be wherever it runs."""
    if sorted(lineup) != sorted(game.seats):
        raise InvalidRequest(
            f"lineup names seats {', '.join(sorted(lineup))}; "
            f"{game.registry_id} has {', '.join(game.seats)}"
        )
    known = set(registered)
    for seat, name in lineup.items():
        if name not in known:
            raise InvalidRequest(f"lineup[{seat!r}]: {name!r} is not registered")


def split_obs(obs: Any, info: Optional[dict] = None) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """(observation, mask) from a PettingZoo observation; the mask from the observation dict,
    else from info["action_mask"], else None."""
    if isinstance(obs, dict):
        return np.asarray(obs[OBS_KEY]), np.asarray(obs[MASK_KEY])
    mask = (info or {}).get(MASK_KEY)
    return np.asarray(obs), None if mask is None else np.asarray(mask)


class GameCopy(ABC):
    """One env; `returns`, `length` and `illegal` describe the game in progress."""

    def __init__(self, env: Any, action_n: dict[str, int]) -> None:
        self.env = env
        self.seats: list[str] = list(env.possible_agents)
        self.action_n = action_n
        self.returns: dict[str, float] = {}
        self.illegal: dict[str, int] = {}
        self.length = 0
        self.over = False
        self.terminated = self.truncated = False
        self._queued: list[SeatOutcome] = []  # outcomes of an illegal move, for `advance`
        self._decided: dict[str, Decision] = {}

    def reset(self, seed: Optional[int] = None) -> None:
        self.returns = dict.fromkeys(self.seats, 0.0)
        self.illegal = dict.fromkeys(self.seats, 0)
        self.length, self.over = 0, False
        self.terminated = self.truncated = False
        self._queued, self._decided = [], {}
        self._reset(seed)

    def advance(self) -> tuple[list[SeatOutcome], list[Decision]]:
        """Outcomes since the last call, and the seats that must move now (none: over)."""
        if self._queued:
            outcomes, self._queued = self._queued, []
            return outcomes, []
        outcomes, decisions = self._advance()
        for outcome in outcomes:
            self.returns[outcome.seat] += outcome.reward
        self._decided = {d.seat: d for d in decisions}
        return outcomes, decisions

    def act(self, actions: dict[str, Any]) -> None:
        """Play one move per deciding seat. An illegal move (outside the mask or the action
        space) ends the game at once, a loss for the mover: it gets ILLEGAL_REWARD, the
        others nothing more, as PettingZoo's TerminateIllegalWrapper rules, but also for
        games without that wrapper and for moves the env could not even take."""
        illegal = [seat for seat, action in actions.items() if not self._legal(seat, action)]
        self.length += len(actions)
        if not illegal:
            self._act({seat: int(action) for seat, action in actions.items()})
            return
        for seat in illegal:
            self.illegal[seat] += 1
        self.over = self.terminated = True
        for seat in self.seats:
            reward = ILLEGAL_REWARD if seat in illegal else 0.0
            self.returns[seat] += reward
            last = self._decided.get(seat)
            obs, mask = (last.obs, last.mask) if last else self._observe(seat)
            self._queued.append(
                SeatOutcome(
                    seat,
                    reward,
                    obs,
                    None if mask is None else np.zeros_like(mask),
                    terminated=True,
                    truncated=False,
                )
            )

    def _legal(self, seat: str, action: Any) -> bool:
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)):
            return False
        if not 0 <= action < self.action_n[seat]:
            return False
        mask = self._decided[seat].mask
        return mask is None or bool(mask[action])

    @abstractmethod
    def _reset(self, seed: Optional[int]) -> None: ...

    @abstractmethod
    def _advance(self) -> tuple[list[SeatOutcome], list[Decision]]: ...

    @abstractmethod
    def _act(self, actions: dict[str, int]) -> None: ...

    @abstractmethod
    def _observe(self, seat: str) -> tuple[np.ndarray, Optional[np.ndarray]]: ...


class AecCopy(GameCopy):
    """Turn-based: one seat moves at a time; a seat's reward since its last move and its
    termination come from ``env.last()`` when its turn comes, and after the game ends every
    seat's turn comes once more (PettingZoo steps it with None): the final rewards."""

    def _reset(self, seed: Optional[int]) -> None:
        self.env.reset(seed=seed)

    def _advance(self) -> tuple[list[SeatOutcome], list[Decision]]:
        env, outcomes = self.env, []
        while env.agents:
            seat = env.agent_selection
            raw, reward, terminated, truncated, info = env.last()
            obs, mask = split_obs(raw, info)
            outcomes.append(
                SeatOutcome(seat, float(reward), obs, mask, bool(terminated), bool(truncated))
            )
            if not (terminated or truncated):
                return outcomes, [Decision(seat, obs, mask)]
            self.terminated |= bool(terminated)
            self.truncated |= bool(truncated)
            env.step(None)
        self.over = True
        return outcomes, []

    def _act(self, actions: dict[str, int]) -> None:
        ((seat, action),) = actions.items()
        self.env.step(action)

    def _observe(self, seat: str) -> tuple[np.ndarray, Optional[np.ndarray]]:
        return split_obs(self.env.observe(seat), self.env.infos.get(seat))


class ParallelCopy(GameCopy):
    """Simultaneous moves: every live seat moves each round, and each move's outcome is
    known as soon as the round is played."""

    def _reset(self, seed: Optional[int]) -> None:
        self._obs, self._infos = self.env.reset(seed=seed)
        self._outcomes: list[SeatOutcome] = []

    def _advance(self) -> tuple[list[SeatOutcome], list[Decision]]:
        outcomes, self._outcomes = self._outcomes, []
        if not self.env.agents:
            self.over = True
            return outcomes, []
        decisions = [
            Decision(seat, *split_obs(self._obs[seat], self._infos.get(seat)))
            for seat in self.env.agents
        ]
        return outcomes, decisions

    def _act(self, actions: dict[str, int]) -> None:
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        self._obs, self._infos = obs, infos
        for seat in actions:
            observation, mask = split_obs(obs[seat], infos.get(seat))
            self.terminated |= bool(terminations[seat])
            self.truncated |= bool(truncations[seat])
            self._outcomes.append(
                SeatOutcome(
                    seat,
                    float(rewards[seat]),
                    observation,
                    mask,
                    bool(terminations[seat]),
                    bool(truncations[seat]),
                )
            )

    def _observe(self, seat: str) -> tuple[np.ndarray, Optional[np.ndarray]]:
        return split_obs(self._obs[seat], self._infos.get(seat))


def make_copy(api: str, registry_id: str, kwargs: dict[str, Any]) -> GameCopy:
    env = make_env(api, registry_id, kwargs)
    action_n = {seat: int(env.action_space(seat).n) for seat in env.possible_agents}
    return (ParallelCopy if api == "parallel" else AecCopy)(env, action_n)


RESULTS = ("win", "draw", "loss")


def result_for(seat: str, won: Optional[str]) -> str:
    """`seat`'s result in a game `won` by that seat (None: a draw)."""
    return "draw" if won is None else ("win" if won == seat else "loss")


def winner(returns: dict[str, float], illegal: dict[str, int]) -> Optional[str]:
    """The seat that won, None for a draw: an illegal move loses (the one seat that made
    none wins); otherwise the one seat with the highest return (rock-paper-scissors: the
    sign of the summed rewards over its rounds)."""
    clean = [seat for seat, n in illegal.items() if n == 0]
    if len(clean) < len(illegal):
        return clean[0] if len(clean) == 1 else None
    best = max(returns.values())
    leaders = [seat for seat, value in returns.items() if value == best]
    return leaders[0] if len(leaders) == 1 else None
