"""The two kinds of league `LeagueOrchestrator` runs, behind one interface (`LeagueMode`):

- `BattleMode`: players that play each other, pairs of agents on PettingZoo game
  orchestrator workers, with frozen agents for the snapshots;
- `SoloMode`: players that train alone on a gymnasium env, on gym orchestrator workers,
  each bound to one player (a gym orchestrator takes exactly one agent).

`validate` and `start` pick the mode from the players' types (a mix is refused); the
orchestrator does everything else the same way for both (set-ups, jobs, faults,
checkpoints, league.json). What differs, each in one method: initialize's checks and
status, the agents' config and which may register, the calls a startEpisode may be, the
startEpisode a job plays, how its steps and results are counted, and the budget's steps.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional, Protocol, Union, cast

import gymnasium as gym

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.orchestrator import AbstractOrchestrator
from mistk_rl.games.enumerate import check_enumerable
from mistk_rl.games.pettingzoo_games import GameInfo, check_lineup, probe_game, result_for
from mistk_rl.league.payoff import Result
from mistk_rl.league.player import ActivePlayer, MainPlayer, solo_players
from mistk_rl.league.scheduler import Assignment
from mistk_rl.sdk.client import Played
from mistk_rl.sdk.schemas import (
    AgentSettings,
    EpisodeConfig,
    EpisodeResult,
    GameEpisodeSettings,
    LeagueSettings,
)
from mistk_rl.spaces import space_to_dict
from orchestrators.gym_orchestrator import probe_env


class Told(NamedTuple):
    """What a finished job's episodes tell the league (`LeagueJobs.finish`)."""

    results: list[Result]  # each game's, from the launching player's side (solo: none)
    returns: Optional[list[float]]  # a solo job's whole episodes' (games: None)


class LeagueMode(Protocol):
    """What a battle and a solo league do differently, once initialized (module doc)."""

    bind_workers: bool  # each worker bound to one player (`Scheduler`'s bind)

    def status(self, players: list[str]) -> dict[str, Any]:
        """initialize's status fields."""
        ...

    def agent_config(self) -> dict[str, Any]:
        """What every agent is told at registration: spaces and properties."""
        ...

    def check_agent(self, name: str, skip_train: bool) -> None:
        """InvalidRequest for an agent this kind of league cannot take."""
        ...

    def check_last_agent(self, pooled: bool) -> None:
        """InvalidRequest when the last agent leaves the league short of a frozen agent
        (`pooled`: one is registered, or the last one is)."""
        ...

    def check_start(self, config: GameEpisodeSettings, agents: Iterable[str]) -> None:
        """InvalidRequest for a startEpisode this league cannot forward (lineups and
        enumerations of the registered `agents`)."""
        ...

    def episode_config(self, settings: LeagueSettings, assignment: Assignment) -> EpisodeConfig:
        """The startEpisode a job plays on its worker."""
        ...

    def steps(self, played: Played, home: str) -> int:
        """The player's steps in what a job played (its snapshot clock, the budget)."""
        ...

    def record(
        self,
        orch: AbstractOrchestrator,
        assignment: Assignment,
        episodes: list[EpisodeResult],
        steps: int,
    ) -> Told:
        """A finished job's episodes (its player's `steps`) into `orch`'s results and env
        steps; what the league is told of them."""
        ...

    def counts(self, player: ActivePlayer) -> bool:
        """Whether the player's steps count towards a startEpisode's numSteps."""
        ...


def validate(
    env: dict[str, Any], settings: LeagueSettings, agents_needed: int, modules: frozenset[str]
) -> None:
    """initialize's checks of the kind of league the players make."""
    _kind(settings).validate(env, settings, agents_needed, modules)


def start(env: dict[str, Any], settings: LeagueSettings, modules: frozenset[str]) -> LeagueMode:
    """The mode of a league initialized with `env` (checked by `validate`)."""
    return _kind(settings).start(env, modules)


def _kind(settings: LeagueSettings) -> Union[type[BattleMode], type[SoloMode]]:
    """The mode the players' types make: where a league is told battle from solo."""
    try:
        solo = solo_players({p.id: p.type for p in settings.players})
    except ValueError as exc:
        raise InvalidRequest(f"env.league.players: {exc}") from exc
    return BattleMode if solo is None else SoloMode


class BattleMode:
    """Players that play each other on game orchestrator workers (the orchestrator's
    module doc): a job is `gamesPerJob` games of the player against its opponent, seats
    alternating."""

    bind_workers = False

    def __init__(self, env_id: str, game: GameInfo) -> None:
        self.env_id, self.game = env_id, game

    @staticmethod
    def validate(
        env: dict[str, Any], settings: LeagueSettings, agents_needed: int, modules: frozenset[str]
    ) -> None:
        """A main player; fixed opponents unique, neither players nor in the pool (and some
        when a player has the fixed branch); a frozen agent at least; a game."""
        ids = [p.id for p in settings.players]
        if not any(p.type == "main" for p in settings.players):
            raise InvalidRequest("env.league.players: a league needs a main player")
        fixed = set(settings.fixed)
        if (
            len(fixed) != len(settings.fixed)
            or fixed & set(ids)
            or fixed & set(settings.pool or ())
        ):
            raise InvalidRequest(
                f"env.league.fixed {settings.fixed}: unique names, neither "
                "a player's nor in pool (a fixed opponent is played by its "
                "own agent, registered with skipTrain)"
            )
        wanting = [p.id for p in settings.players if (p.branches or {}).get("fixed")]
        if wanting and not fixed:
            raise InvalidRequest(
                f"env.league.players {wanting}: the fixed branch plays the "
                "fixed opponents, and env.league.fixed names none"
            )
        if agents_needed <= len(ids) + len(fixed):
            raise InvalidRequest(
                f"agentsNeeded {agents_needed}: one agent per player "
                f"({len(ids)}), one per fixed opponent ({len(fixed)}) and at "
                "least one frozen agent (skipTrain) for the snapshots"
            )
        probe_game({"id": env["id"], "kwargs": env.get("kwargs", {})})

    @classmethod
    def start(cls, env: dict[str, Any], modules: frozenset[str]) -> BattleMode:
        return cls(env["id"], probe_game(env))

    def status(self, players: list[str]) -> dict[str, Any]:
        return {"game": self.env_id, "seats": list(self.game.seats), "players": players}

    def agent_config(self) -> dict[str, Any]:
        obs_space, act_space = self.game.spaces[self.game.seats[0]]  # (the seats share them)
        return {
            "observationSpace": space_to_dict(obs_space),
            "actionSpace": space_to_dict(act_space),
            "properties": {"game": self.env_id, "league": True},
        }

    def check_agent(self, name: str, skip_train: bool) -> None:
        """Any: frozen agents (skipTrain) play snapshots and fixed opponents."""

    def check_last_agent(self, pooled: bool) -> None:
        if not pooled:
            raise InvalidRequest(
                "the last agent leaves the league without a frozen "
                "agent (skipTrain, in pool) to load snapshots"
            )

    def check_start(self, config: GameEpisodeSettings, agents: Iterable[str]) -> None:
        """A game call forwarded to a worker: checked here, so a caller's mistake is a 400
        and not a worker's refusal that fails the league."""
        if config.lineup is not None:
            check_lineup(self.game, config.lineup, agents)
        if config.exhaustive is not None:
            check_enumerable(self.game, config.exhaustive.agent, config.exhaustive.opponent, agents)

    def episode_config(self, settings: LeagueSettings, assignment: Assignment) -> EpisodeConfig:
        """The player (collect mode, training) against its opponent (`opponentMode`, never
        learning), seats alternating, seeded per job when the league is."""
        s, home, opponent = settings, assignment.home, assignment.opponent_agent
        agents = {home: AgentSettings(mode="collect", train=True)}
        if opponent != home:
            agents[opponent] = AgentSettings(mode=s.opponent_mode, train=False)
        seats = self.game.seats
        return EpisodeConfig(
            num_episodes=s.games_per_job,
            seed=None if s.seed is None else s.seed + assignment.job_id * s.num_envs,
            num_envs=min(s.num_envs, s.games_per_job),
            train=True,
            lineup={seats[0]: home, seats[1]: opponent},
            seat_assignment="alternate",
            agents=agents,
        )

    def steps(self, played: Played, home: str) -> int:
        """The player's moves."""
        return played.agent_steps(home)

    def record(
        self,
        orch: AbstractOrchestrator,
        assignment: Assignment,
        episodes: list[EpisodeResult],
        steps: int,
    ) -> Told:
        """Each game from the player's seat; the job's moves, both sides', in env steps."""
        job, results = assignment.running.job, []
        for game in episodes:
            seat = next(
                seat for seat, agent in (game.seats or {}).items() if agent == job.launch_player
            )
            results.append(cast(Result, result_for(seat, game.winner)))  # (typed str there)
            orch.record_episode(
                job.launch_player,
                (game.returns or {})[seat],
                game.length,
                job=assignment.job_id,
                opponent=job.opponent,
                branch=job.branch,
                seats=game.seats,
                winner=game.winner,
                illegal=game.illegal,
            )
        orch.env_steps += sum(game.length for game in episodes)
        return Told(results, None)

    def counts(self, player: ActivePlayer) -> bool:
        """The main players' moves."""
        return isinstance(player, MainPlayer)


class SoloMode:
    """Players that train alone on gym orchestrator workers, each worker bound to one player
    (the orchestrator's module doc): a job is the player's `Job.settings`."""

    bind_workers = True

    def __init__(self, env_id: str, spaces: tuple[gym.Space, gym.Space]) -> None:
        self.env_id, self.spaces = env_id, spaces

    @staticmethod
    def validate(
        env: dict[str, Any], settings: LeagueSettings, agents_needed: int, modules: frozenset[str]
    ) -> None:
        """A worker per player at least, an agent per player and no other, an env every
        player's kwargs can make."""
        ids = [p.id for p in settings.players]
        if len(settings.workers) < len(ids):
            raise InvalidRequest(
                f"env.league.workers: a solo league binds each gym orchestrator worker to "
                f"one player (a gym orchestrator takes one agent): {len(settings.workers)} "
                f"workers for {len(ids)} solo players; give at least {len(ids)}"
            )
        if settings.pool is not None or settings.fixed:
            raise InvalidRequest("env.league.pool, fixed: a solo league has no frozen agents")
        if agents_needed != len(ids):
            raise InvalidRequest(
                f"agentsNeeded {agents_needed}: a solo league's agents are "
                f"its players, one each ({len(ids)})"
            )
        kwargs = dict(env.get("kwargs", {}))
        _probe_gym({"id": env["id"], "kwargs": kwargs}, modules)
        for p in settings.players:
            if p.env_kwargs:
                _probe_gym(
                    {"id": env["id"], "kwargs": {**kwargs, **p.env_kwargs}},
                    modules,
                    f"player {p.id!r}: ",
                )

    @classmethod
    def start(cls, env: dict[str, Any], modules: frozenset[str]) -> SoloMode:
        return cls(env["id"], _probe_gym(env, modules))

    def status(self, players: list[str]) -> dict[str, Any]:
        return {"env": self.env_id, "players": players}

    def agent_config(self) -> dict[str, Any]:
        obs_space, act_space = self.spaces
        return {
            "observationSpace": space_to_dict(obs_space),
            "actionSpace": space_to_dict(act_space),
            "properties": {"env": self.env_id, "league": True},
        }

    def check_agent(self, name: str, skip_train: bool) -> None:
        if skip_train:
            raise InvalidRequest(
                f"agent {name!r}: a solo league has no frozen agents "
                "(skipTrain); its agents are its players"
            )

    def check_last_agent(self, pooled: bool) -> None:
        """Nothing short: its agents are its players."""

    def check_start(self, config: GameEpisodeSettings, agents: Iterable[str]) -> None:
        if config.lineup is not None or config.exhaustive is not None:
            raise InvalidRequest(
                "lineup and exhaustive are games': a solo league plays no "
                "games (evaluate a solo player's agent on a gym "
                "orchestrator)"
            )

    def episode_config(self, settings: LeagueSettings, assignment: Assignment) -> EpisodeConfig:
        """`Job.settings` (numEnvs, numEpisodes, train, the player's agent with its epsilon,
        envKwargs), seeded per job when the league is."""
        job_settings = dict(assignment.running.job.settings)
        if settings.seed is not None:
            job_settings["seed"] = settings.seed + assignment.job_id * job_settings.get(
                "numEnvs", 1
            )
        return EpisodeConfig.model_validate(job_settings)

    def steps(self, played: Played, home: str) -> int:
        """The env steps (a gym orchestrator counts them, all its one agent's)."""
        return played.env_steps

    def record(
        self,
        orch: AbstractOrchestrator,
        assignment: Assignment,
        episodes: list[EpisodeResult],
        steps: int,
    ) -> Told:
        """Each episode (its envSteps: the count at its end), then the env steps as the
        worker counted them; the returns of the whole episodes."""
        job, player = assignment.running.job, assignment.home
        steps_before, returns = orch.env_steps, []
        for episode in episodes:
            orch.env_steps += episode.length
            if not (episode.abnormal or episode.cancelled):
                returns.append(episode.return_)
            extra = {
                "envIndex": episode.env_index,
                "terminated": episode.terminated,
                "truncated": episode.truncated,
                "abnormal": episode.abnormal,
                "cancelled": episode.cancelled,
            }
            orch.record_episode(
                player,
                episode.return_,
                episode.length,
                job=assignment.job_id,
                branch=job.branch,
                **{k: v for k, v in extra.items() if v is not None},
            )
        orch.env_steps = steps_before + steps  # (the worker's count is the truth)
        return Told([], returns)

    def counts(self, player: ActivePlayer) -> bool:
        """Every player's env steps."""
        return True


def _probe_gym(
    env: dict[str, Any], modules: frozenset[str], who: str = ""
) -> tuple[gym.Space, gym.Space]:
    """`probe_env` (the gym orchestrator's initialize check), its refusal naming `who`."""
    try:
        return probe_env(env, modules)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{who}{exc}") from exc
