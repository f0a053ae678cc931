"""Typed request and response bodies, mirroring `mistk_rl/openapi/*.yaml` (a contract test keeps the
field names equal). The SDK returns these; the wire format is camelCase JSON."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from mistk_rl.games.opponents import OPPONENTS
from mistk_rl.league.player import PLAYER_TYPES

Tensor = Union[float, int, list[Any]]
"""A number or a nested list of numbers (the spec's ``Tensor``)."""
Observation = Union[Tensor, dict[str, Tensor]]
"""A Tensor, or one Tensor per key for a Dict observation space (the spec's ``Observation``)."""


class Body(BaseModel):
    """camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class Status(Body):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    state: str
    resource_version: int
    payload: dict[str, Any] = Field(default_factory=dict)
    reason: Optional[str] = None
    allowed: list[str] = Field(default_factory=list)
    instance: Optional[str] = None  # changes when the service restarts


class ApiVersion(Body):
    version: str
    role: Literal["agent", "orchestrator"]
    capabilities: list[str] = Field(default_factory=list)


class FileWritten(Body):
    """putFile's answer: the file as the service stored it."""

    path: str
    bytes: int
    sha256: str


class Problem(Body):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    status: int
    title: str
    type: Optional[str] = None
    detail: Optional[str] = None
    state: Optional[str] = None
    allowed: Optional[list[str]] = None


class FundamentalSpace(Body):
    """A gymnasium space as data; `mistk_rl.spaces` converts both ways."""

    type: Literal["Box", "Discrete", "MultiDiscrete", "MultiBinary"]
    shape: Optional[list[int]] = None
    dtype: Optional[str] = None
    low: Optional[Tensor] = None
    high: Optional[Tensor] = None
    n: Optional[int] = None
    start: Optional[int] = None
    nvec: Optional[Tensor] = None


class DictSpace(Body):
    """A gymnasium Dict of fundamental spaces (keys: `mistk_rl.spaces.DICT_KEY`)."""

    type: Literal["Dict"]
    spaces: dict[str, FundamentalSpace] = Field(min_length=1, max_length=64)


Space = Annotated[Union[FundamentalSpace, DictSpace], Field(discriminator="type")]


class AgentInitParams(Body):
    model_properties: dict[str, Any] = Field(default_factory=dict)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)


class AgentConfig(Body):
    """What an orchestrator tells an agent at registration."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    observation_space: Optional[Space] = None
    action_space: Optional[Space] = None
    train: bool = True
    properties: dict[str, Any] = Field(default_factory=dict)


class EpisodeStart(Body):
    obs: dict[str, Observation]
    action_mask: Optional[dict[str, Tensor]] = None
    mode: Literal["collect", "eval"] = "collect"
    episode: Optional[int] = None
    epsilon: Optional[float] = Field(default=None, ge=0, le=1)


class ActionRequest(Body):
    obs: dict[str, Observation]
    action_mask: Optional[dict[str, Tensor]] = None


class ActionResponse(Body):
    actions: dict[str, Tensor]


class Replay(Body):
    """The transitions that followed the last actions, one entry per entity."""

    prev_obs: dict[str, Observation]
    actions: dict[str, Tensor]
    rewards: dict[str, float]
    new_obs: dict[str, Observation]
    terminated: dict[str, bool]
    truncated: Optional[dict[str, bool]] = None
    new_action_mask: Optional[dict[str, Tensor]] = None  # legal actions in new_obs


class StepRequest(Body):
    replay: Optional[Replay] = None
    obs: dict[str, Observation]
    action_mask: Optional[dict[str, Tensor]] = None


Column = Any
"""The spec's ``Column``: one row per env copy, nested lists (JSON) or a numpy array; for a
Dict observation space a dict of them (checked against the spaces by the service)."""


class PolicyCopy(Body):
    """getPolicy's answer (local inference; `mistk_rl.framework.agent.PolicyDescription` says each
    field)."""

    policy: str
    config: dict[str, Any]
    observation_space: Space
    action_space: Space
    seed: Optional[int] = None
    env_steps: int
    warmup_until: int
    version: int
    extras: dict[str, list[int]]
    optional_extras: list[str]
    weights: Optional[dict[str, Any]] = None  # name -> array


class ReplayColumns(Body):
    """Experience from a copy of the policy (`AgentClient.replay_columns` says each)."""

    envs: Column
    obs: Column
    actions: Column
    extras: Optional[dict[str, Column]] = None
    rewards: Column
    next_obs: Column
    terminated: Column
    truncated: Optional[Column] = None
    next_action_mask: Optional[Column] = None
    weights_version: int = -1
    sync_every: int = 1


class Learned(Body):
    """replayColumns' answer: the agent's env steps and weights' version, and the weights
    when they are due."""

    env_steps: int
    version: int
    weights: Optional[dict[str, Any]] = None


class ColumnActions(Body):
    """stepColumns' answer: the acting rows' actions, and the step id of each (name it when
    reporting that step's outcome)."""

    actions: Column
    step_ids: Column

    def __len__(self) -> int:
        return len(self.step_ids)


class LeaguePlayerSpec(Body):
    """A league's player: its id (the name its agent registers with), its type, and the
    settings of its type (a solo player's: `SoloActivePlayer`'s env kwargs, env copies,
    episodes per job and epsilon decay); a setting its type does not have is refused."""

    id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    type: Annotated[str, AfterValidator(PLAYER_TYPES.validate)]
    env_kwargs: Optional[dict[str, Any]] = None
    num_envs: Optional[int] = Field(default=None, ge=1, le=1024)
    episodes_per_job: Optional[int] = Field(default=None, ge=1, le=100_000)
    eps_start: Optional[float] = Field(default=None, ge=0, le=1)
    eps_end: Optional[float] = Field(default=None, ge=0, le=1)
    eps_decay: Optional[int] = Field(default=None, ge=0)
    forget_on_reset: Optional[bool] = None  # battle: its payoff records cleared at a reset
    # matchmaking branch -> probability (DI-engine's branch_probs); default: its type's
    branches: Optional[dict[str, Annotated[float, Field(ge=0, le=1)]]] = Field(
        default=None, min_length=1, max_length=8
    )

    @model_validator(mode="after")
    def _settings_of_its_type(self) -> "LeaguePlayerSpec":
        kind = PLAYER_TYPES[self.type]
        known = {f.name for f in dataclasses.fields(kind)}
        alien = [to_camel(k) for k in self.settings() if k not in known]
        if alien:
            own = [
                to_camel(k)
                for k in type(self).model_fields
                if k in known and k not in ("id", "type")
            ]
            raise ValueError(
                f"player {self.id!r} ({self.type}) has no setting "
                f"{', '.join(alien)} (its settings: {', '.join(own) or 'none'})"
            )
        if self.branches is not None:
            own = kind.available_branches()
            unknown = [b for b in self.branches if b not in own]
            if unknown:
                raise ValueError(
                    f"player {self.id!r} ({self.type}) has no branch "
                    f"{', '.join(unknown)} (its branches: {', '.join(own)})"
                )
            if abs(sum(self.branches.values()) - 1.0) > 1e-6:
                raise ValueError(
                    f"player {self.id!r}: branch probabilities must sum to 1, "
                    f"not {sum(self.branches.values()):g}"
                )
        return self

    def settings(self) -> dict[str, Any]:
        """Its type's settings given (snake_case: the player class's fields)."""
        return self.model_dump(exclude={"id", "type"}, exclude_none=True)


class LeagueSettings(Body):
    """The league orchestrator's settings (the spec's LeagueSettings says what each is)."""

    players: list[LeaguePlayerSpec] = Field(min_length=1, max_length=32)
    workers: list[str] = Field(min_length=1, max_length=64)
    pool: Optional[list[str]] = Field(default=None, max_length=64)
    fixed: list[str] = Field(default_factory=list, max_length=64)  # played as they are
    directory: str = Field(default="league", min_length=1, max_length=1024)
    copy_checkpoints: bool = False  # over HTTP (getFile/putFile), not a shared directory
    one_phase_step: int = Field(default=20_000, ge=1)
    max_active_player_job: int = Field(default=1, ge=1, le=64)
    games_per_job: int = Field(default=64, ge=1, le=100_000)
    num_envs: int = Field(default=16, ge=1, le=1024)
    opponent_mode: Literal["collect", "eval"] = "collect"
    job_timeout: float = Field(default=600.0, ge=1)
    # a failing worker: dropped after this many failures in a row, retried (reset and set
    # up again) after workerBackoff seconds, doubling per failure up to workerBackoffMax
    max_worker_failures: int = Field(default=5, ge=1, le=100)
    worker_backoff: float = Field(default=1.0, ge=0, le=600)
    worker_backoff_max: float = Field(default=30.0, ge=0, le=3600)
    seed: Optional[int] = Field(default=None, ge=0)
    deterministic: bool = False  # results applied in launch order (the spec says what)


class EnvSpec(Body):
    """initialize's env: what every orchestrator reads. Each orchestrator class names the
    model it takes (`AbstractOrchestrator.env_settings`): a key of another's is a 400."""

    id: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


class EnvWorkers(Body):
    """What each env copy of envManager ray asks of its node (`RayEnvManager`)."""

    cpus: float = Field(default=1.0, ge=0)
    resources: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)


class DmEnvRpcSettings(Body):
    """An env served over dm_env_rpc (`mistk_rl.bridges.dm_env_rpc_client`): the server's
    address; the world each env copy joins (default: each creates its own, with the env's
    kwargs as the world's settings, and destroys it after); JoinWorld's settings; the Reset
    setting that carries a seed (dm_env_rpc has none of its own; mistk-rl's server calls it
    ``seed``); how long connecting and each answer may take, in seconds."""

    address: str = Field(pattern=r"^[A-Za-z0-9_.\-\[\]:]{1,255}:[0-9]{1,5}$")
    world: Optional[str] = Field(default=None, max_length=255)
    join_settings: dict[str, Any] = Field(default_factory=dict)
    seed_setting: Optional[str] = Field(default=None, min_length=1, max_length=64)
    connect_timeout: float = Field(default=5.0, ge=0.001, le=300)
    timeout: float = Field(default=30.0, ge=0.001, le=3600)


class GymEnvSpec(EnvSpec):
    """The gym orchestrator's: the Thinker MDP's settings, mistk_rl.thinker.config's
    snake_case keys as the seed names them, checked by load_config (an unknown key is a 400);
    where envManager ray places env copies; a dm_env_rpc server whose worlds are the env
    copies (then `id` is only a label)."""

    thinker: Optional[dict[str, Any]] = None
    env_workers: Optional[EnvWorkers] = None
    dm_env_rpc: Optional[DmEnvRpcSettings] = None


class LeagueEnvSpec(EnvSpec):
    """The league orchestrator's: its players and workers."""

    league: Optional[LeagueSettings] = None


class AnyEnvSpec(GymEnvSpec, LeagueEnvSpec):
    """The SDK's: every orchestrator's keys (the spec's OrchestratorInitParams.env)."""


class OrchestratorInitParams(Body):
    env: AnyEnvSpec
    agents_needed: int = Field(default=1, ge=1, le=64)


class LeagueWorker(Body):
    """A league's worker and its health (`mistk_rl.league.scheduler` says what each is)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    url: str
    state: Literal["new", "setting_up", "idle", "busy", "backoff", "dropped"]
    failures: int = 0
    failed: int = 0
    jobs: int = 0
    set_ups: int = 0
    job: Optional[int] = None
    retry_in_s: Optional[float] = Field(default=None, alias="retryInS")
    last_error: Optional[str] = None
    player: Optional[str] = None  # solo leagues: the player it is bound to
    replaced_by: Optional[int] = None  # a replaced worker: the index of the one in its place


class LeagueWorkerJoin(Body):
    """POST /league/workers: a worker joins a league, in place of `replaces` if given."""

    url: str
    replaces: Optional[str] = None


class League(Body):
    """GET /league: the players (best first), the payoff matrix, the jobs, the pool, the
    workers."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    players: list[dict[str, Any]]
    payoff: dict[str, Any]
    jobs: dict[str, Any]
    pool: dict[str, Any] = Field(default_factory=dict)
    workers: list[LeagueWorker] = Field(default_factory=list)
    joining: list[LeagueWorkerJoin] = Field(default_factory=list)


class LeagueProgress(Body):
    """A league's counts in its status payload (`OrchestratorProgress.league`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    jobs: int = 0
    finished: int = 0
    failed: int = 0
    running: int = 0
    snapshots: int = 0
    workers: int = 0


class OrchestratorProgress(Body):
    """An orchestrator's status payload, typed (every key optional; others are kept as
    extras): `OrchestratorClient.progress` returns it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    env_steps: int = 0
    episodes_done: int = 0
    agent_steps: dict[str, int] = Field(default_factory=dict)
    game: Optional[str] = None
    seats: Optional[list[str]] = None
    league: Optional[LeagueProgress] = None


class OrchestratorStatus(Status):
    """An orchestrator's Status with its payload typed."""

    payload: OrchestratorProgress = Field(default_factory=OrchestratorProgress)  # type: ignore[assignment]


class LocalInferenceSettings(Body):
    """Act with a copy of the agent's policy next to the env (`mistk_rl.sdk.stepping`)."""

    sync_every: int = Field(default=1, ge=1)
    batch_steps: int = Field(default=64, ge=1, le=65536)


class AgentSettings(Body):
    """How one agent plays in one startEpisode call (None: the call's default)."""

    mode: Optional[Literal["collect", "eval"]] = None
    train: Optional[bool] = None
    epsilon: Optional[float] = Field(default=None, ge=0, le=1)
    local_inference: Optional[LocalInferenceSettings] = None


class ExhaustiveSpec(Body):
    """Games: enumerate every game of `agent` (greedy) against all of `opponent`'s replies."""

    agent: str
    opponent: Annotated[str, AfterValidator(OPPONENTS.validate)]
    max_positions: int = Field(default=200_000, ge=1)


class EpisodeSettings(Body):
    """startEpisode's options every orchestrator takes: `num_episodes` episodes (default 1),
    or episodes until `num_steps` env steps were taken (then `num_episodes` is an optional
    cap). Each orchestrator class names the model it takes
    (`AbstractOrchestrator.episode_settings`): an option of another's is a 400 naming it."""

    num_episodes: Optional[int] = Field(default=None, ge=1)
    num_steps: Optional[int] = Field(default=None, ge=1)
    seed: Optional[int] = Field(default=None, ge=0)
    train: bool = True
    num_envs: int = Field(default=1, ge=1, le=1024)
    agents: dict[str, AgentSettings] = Field(default_factory=dict)

    def episode_limit(self) -> Optional[int]:
        if self.num_episodes is not None:
            return self.num_episodes
        return None if self.num_steps is not None else 1


class GymEpisodeSettings(EpisodeSettings):
    """The gym orchestrator's: env managers, step caps and timeouts, resumable budgets."""

    max_steps: Optional[int] = Field(default=None, ge=1)
    env_manager: Literal["base", "subprocess", "async", "ray"] = "base"
    step_timeout: Optional[float] = Field(default=None, ge=0.01)
    resume: bool = False  # with num_steps: cut at the budget, continue in the next call
    env_kwargs: Optional[dict[str, Any]] = None  # over initialize's kwargs
    # stepColumns requests in flight at once, each for its share of the env copies
    # (`mistk_rl.sdk.stepping.ColumnStepper`)
    pipeline_depth: int = Field(default=1, ge=1, le=8)


class GameEpisodeSettings(EpisodeSettings):
    """The game and league orchestrators': who sits where, and exhaustive evaluations."""

    seat_assignment: Literal["fixed", "alternate", "random"] = "fixed"
    lineup: Optional[dict[str, str]] = None  # seat -> agent for this call (default: bindings)
    exhaustive: Optional[ExhaustiveSpec] = None


class EpisodeConfig(GymEpisodeSettings, GameEpisodeSettings):
    """The SDK's startEpisode body: every orchestrator's options (the spec's EpisodeConfig);
    each orchestrator takes its own (`GymEpisodeSettings`, `GameEpisodeSettings`). Only what
    the caller set is sent."""

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, exclude_unset=True)


class EpisodeResult(Body):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    episode: int
    agent: str
    return_: float = Field(alias="return")
    length: int
    env_steps: Optional[int] = None
    seed: Optional[int] = None
    terminated: Optional[bool] = None
    truncated: Optional[bool] = None
    cancelled: Optional[bool] = None
    abnormal: Optional[bool] = None
    env_index: Optional[int] = None
    train: Optional[bool] = None
    # games: who held which seat, each seat's return and illegal moves, the winning seat
    # (None: a draw, or no game)
    seats: Optional[dict[str, str]] = None
    returns: Optional[dict[str, float]] = None
    winner: Optional[str] = None
    illegal: Optional[dict[str, int]] = None
    # leagues: the job that played it, its opponent and matchmaking branch
    job: Optional[int] = None
    opponent: Optional[str] = None
    branch: Optional[str] = None


class Results(Body):
    episodes: list[EpisodeResult] = Field(default_factory=list)
    totals: Optional[dict[str, Any]] = None  # games: per agent and seat
    evaluations: Optional[list[dict[str, Any]]] = None  # games: exhaustive evaluations
