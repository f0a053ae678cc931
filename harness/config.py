"""The harness's YAML config, validated (an unknown or misspelt key is an error naming it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mistk_rl._moved import renamed
from mistk_rl.league.player import PLAYER_TYPES, solo_players
from mistk_rl.registry import suggest
from mistk_rl.sdk.schemas import AgentSettings, LocalInferenceSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServiceSpec(_Strict):
    """Either `target` (MODULE:CLASS, started on a free loopback port, or on a cluster node)
    or `url` (running)."""

    target: Optional[str] = None  # MODULE:CLASS to serve, on a free port the harness picks
    url: Optional[str] = None  # a running service's base URL instead
    # more `mistk-rl serve` options for a service the harness starts, e.g.
    # ["--env-module", "my_envs", "--agent-timeout", "60", "--limit", "max_envs=512"]
    args: list[str] = Field(default_factory=list)
    # what the service asks of its node on a cluster (`cluster:`; unused on one machine):
    # CPUs, GPUs and custom node resources, e.g. {"game_node": 1} to run it on such a node
    cpus: float = Field(default=1.0, ge=0)
    gpus: float = Field(default=0.0, ge=0)  # GPUs it asks of its node on a cluster
    # custom node resources (none, for a league orchestrator: the driver's node if it has room)
    resources: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_of(self) -> "ServiceSpec":
        if (self.target is None) == (self.url is None):
            raise ValueError("give exactly one of 'target' (start it) or 'url' (use it)")
        return self


# (the pydantic plugin's __init__ takes the extra keys as **kwargs: the field `kwargs` clashes)
class RunEnvSpec(BaseModel):  # type: ignore[no-redef]
    """initialize's env as it is sent: `id`, `kwargs` and whatever settings the orchestrator
    takes (its `env_settings`; it refuses with a 400 naming a key it does not take, with a
    suggestion, so the harness keeps no list of them: e.g. the gym orchestrator's `thinker`)."""

    model_config = ConfigDict(extra="allow")
    id: str  # a gymnasium id, or a PettingZoo game's (e.g. classic/tictactoe-v3)
    kwargs: dict[str, Any] = Field(default_factory=dict)  # passed to the env's constructor
    # the league orchestrator's settings (the spec's LeagueSettings, camelCase keys): the
    # harness reads it (it fills in `workers` with the URLs of the workers it starts)
    league: Optional[dict[str, Any]] = None

    def solo_players(self) -> Optional[list[str]]:
        """A solo league's player ids (every player of type solo), else None."""
        players = (self.league or {}).get("players") or []
        types = {p.get("id"): PLAYER_TYPES.validate(p.get("type", "")) for p in players}
        try:
            return solo_players(types) if types else None
        except ValueError:  # a mix: no solo league (the league orchestrator names both)
            return None


class OrchestratorSpec(ServiceSpec):
    """The orchestrator: the env it runs (or the league) and where it comes from."""

    env: RunEnvSpec  # sent with initialize


class LocalInferenceSpec(_Strict):
    """Act with a copy of the agent's policy in the orchestrator, next to the env (local
    inference, `mistk_rl.sdk.stepping.LocalStepper`): the experience goes to the agent every
    `batch_steps` env steps; new weights come back once the agent made `sync_every`
    updates (DQN: gradient steps; PPO: whole updates) since the copy's."""

    sync_every: int = Field(default=1, ge=1)  # agent updates between weight copies
    batch_steps: int = Field(default=64, ge=1, le=65536)  # env steps per experience upload


class AgentSpec(ServiceSpec):
    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")  # its name in the run and the games
    # initialize's hyperparameters: the agent's settings over its defaults (see below)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    properties: dict[str, Any] = Field(default_factory=dict)  # initialize's modelProperties
    model_path: Optional[str] = None  # buildModel from this checkpoint (agent's data dir)
    save_path: Optional[str] = None  # saveModel here when the run ends
    train: bool = True  # false: registered with skipTrain (never gets replayAction)
    seats: Optional[list[str]] = None  # games: the seats it holds (default: the next free)
    # training and evaluation episodes act with a copy of its policy in the orchestrator
    # (an agent with the capability "local": DQN, PPO; gym envs)
    local_inference: Optional[LocalInferenceSpec] = None

    def settings(self) -> Optional[AgentSettings]:
        """How it plays in a training run's episodes, when that is not the default."""
        if self.local_inference is None:
            return None
        return AgentSettings(
            local_inference=LocalInferenceSettings(
                sync_every=self.local_inference.sync_every,
                batch_steps=self.local_inference.batch_steps,
            )
        )


class EpisodeBlock(_Strict):
    """One startEpisode call."""

    num_episodes: int = Field(default=1, ge=1)  # episodes in this call
    seed: Optional[int] = Field(default=None, ge=0)  # env copy i first resets with seed + i
    max_steps: Optional[int] = Field(default=None, ge=1)  # per-episode cap
    train: bool = True  # false: agents are sent no transitions to learn from
    save_path: Optional[str] = None  # saveEpisode here afterwards (orchestrator's data dir)


class TrainingSpec(_Strict):
    """Train for `env_steps`, evaluating every `eval_every` env steps (and once at the end)."""

    env_steps: int = Field(ge=1)  # the budget: env steps over all training env copies
    eval_every: int = Field(default=5000, ge=1)  # env steps between evaluations
    eval_episodes: int = Field(default=10, ge=1)  # greedy episodes per evaluation
    stop_value: Optional[float] = None  # stop once an evaluation's mean reaches it
    seed: int = Field(default=0, ge=0)  # training env i first resets with seed + i
    eval_seed: int = Field(default=10_000, ge=0)  # every evaluation uses the same seeds
    max_steps: Optional[int] = Field(default=None, ge=1)  # per-episode cap
    num_envs: int = Field(default=1, ge=1)  # env copies stepped together (one request)
    # env copies for evaluation; default: one per eval episode, so the whole evaluation is
    # one batched request per step (episodes are split evenly when there are fewer copies)
    eval_envs: Optional[int] = Field(default=None, ge=1)
    env_manager: str = "base"  # base | subprocess | async | ray (env copies as Ray actors)
    # training steps' requests in flight at once, each for its share of the env copies: 2
    # steps one half while the agent answers for the other (the startEpisode setting
    # pipelineDepth; agents that take stepColumns; evaluations use 1)
    pipeline_depth: int = Field(default=1, ge=1, le=8)
    # after each evaluation every agent saves checkpoints/step-<env steps>.pt in its data dir
    # and progress.json in the run dir says where the run stands: what `mistk-rl run
    # --resume RUN_DIR` continues. This many are kept: the one progress.json names and the
    # one before it, to go back to by hand. 0: no checkpoints, no resume
    checkpoints: int = Field(default=2, ge=0)


class Matchup(_Strict):
    """The evaluated agent, greedy, in every seat against `opponent`: enumerated against a
    built-in opponent's replies (`exhaustive`: random, tictactoe_perfect), or sampled games
    against a registered agent of that name."""

    opponent: str  # a built-in opponent or a registered agent's name
    exhaustive: bool = False  # enumerate every game against its replies (random, perfect)
    games_per_seat: int = Field(default=1000, ge=1)  # sampled games per seat
    # how a learned opponent acts in sampled games: greedy (eval), or sampling from its
    # policy (collect), as it plays in training; a greedy one replays a handful of games
    opponent_mode: Literal["eval", "collect"] = "eval"


class GameEvaluation(_Strict):
    """`mistk-rl eval`, the step after training, and each evaluation of `game_training`."""

    agent: str  # the agent evaluated (a name in `agents`)
    against: list[Matchup] = Field(min_length=1)  # its matchups
    num_envs: int = Field(default=16, ge=1)  # game copies for sampled matchups
    seed: int = Field(default=10_000, ge=0)  # the sampled games' first seed
    # every opponent here is one the agent does not train against: a run that would is
    # refused before it trains (without it, such figures are marked "trained against")
    held_out: bool = False


class Target(_Strict):
    """One condition on an evaluation: `opponent`'s matchup, in `seat` (default every seat)."""

    opponent: str  # a matchup's opponent in `evaluation.against`
    seat: Optional[str] = None  # that seat only (default: every seat)
    min_win: Optional[float] = Field(default=None, ge=0, le=1)  # win rate at least
    max_loss: Optional[float] = Field(default=None, ge=0, le=1)  # loss rate at most
    max_lost_lines: Optional[int] = Field(default=None, ge=0)  # enumerated matchups


class GameTrainingSpec(_Strict):
    """Games: play until `evaluation.agent` made `agent_steps` moves, evaluating every
    `eval_every` of its moves (and at the end); a checkpoint of every agent at each."""

    agent_steps: int = Field(ge=1)  # the budget: moves of the evaluated agent
    eval_every: int = Field(default=20_000, ge=1)  # its moves between evaluations
    seed: int = Field(default=0, ge=0)  # seeds the games, block after block
    num_envs: int = Field(default=16, ge=1)  # game copies
    # who takes which seat in each new game: as registered, swapped every game, or drawn
    seat_assignment: Literal["fixed", "alternate", "random"] = "alternate"
    lineup: Optional[dict[str, str]] = None  # seat -> agent; default: the registered seats
    agents: dict[str, dict[str, Any]] = Field(default_factory=dict)  # name -> {mode, train}
    checkpoints: int = Field(default=2, ge=0)  # kept per agent (checkpoints/step-N.pt)
    # stop at the first evaluation meeting every target (its checkpoint is the last saved,
    # so it is kept); none: train the whole budget
    stop_when: list[Target] = Field(default_factory=list)


def member_players(member: str, players: list[str]) -> list[str]:
    """A ladder group's member as players: itself, or a run's checkpoints
    (``MEMBER:step-N``, by moves)."""
    if member in players:
        return [member]
    prefix = f"{member}:step-"
    steps = [p for p in players if p.startswith(prefix) and p[len(prefix) :].isdigit()]
    return sorted(steps, key=lambda p: int(p[len(prefix) :]))


class LadderSpec(_Strict):
    """A round robin (`mistk-rl ladder`, or a config's `ladder` block): every pair of
    `players` plays `games_per_seat` games in each seat order, and their ratings are fitted
    to all the games at once, with intervals (`mistk_rl.league.bradley_terry`)."""

    players: list[str] = Field(min_length=2)  # agents of the run
    anchor: str  # the player rated 0: ratings are Elo points above it
    games_per_seat: int = Field(default=100, ge=1)  # per pair and seat order
    # how learned players act: sampled from their policy (a ladder of greedy players would
    # replay a handful of games), or greedy; built-in opponents play as they always do
    mode: Literal["sampled", "greedy"] = "sampled"
    num_envs: int = Field(default=16, ge=1)  # game copies
    seed: int = Field(default=20_000, ge=0)  # the games' first seed
    resamples: int = Field(default=500, ge=0)  # bootstrap refits for the intervals
    # sides compared as wholes (e.g. a config's seeds): each pair of groups' mean score over
    # all their pairings, with an interval over both sides' members (`crossed_bootstrap`);
    # a member is a player, or a run whose checkpoints are players (compared move by move)
    groups: dict[str, list[str]] = Field(default_factory=dict)


class ClusterSpec(_Strict):
    """Place the services this run starts on a Ray cluster (`mistk_rl.deploy.cluster`).
    `address`: ``auto`` (the cluster this machine belongs to), ``HOST:PORT``,
    ``ray://HOST:PORT``, or ``local`` (a one-node cluster started for the run)."""

    address: str = "auto"  # auto, HOST:PORT, ray://HOST:PORT or local
    # where services keep their data dirs on their nodes (default: the node's temp dir)
    data_root: Optional[str] = None


class WorkerPool(_Strict):
    """``workers: {count: N, ...}``: N workers started alike (default: game orchestrators;
    a solo league's: gym orchestrators), each asking its node for `cpus`, `gpus` and
    `resources` on a cluster."""

    count: int = Field(ge=1, le=64)
    target: Optional[str] = None
    args: list[str] = Field(default_factory=list)
    cpus: float = Field(default=1.0, ge=0)
    gpus: float = Field(default=0.0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)

    def specs(self, solo: bool) -> list[dict[str, Any]]:
        target = self.target or (
            "orchestrators.gym_orchestrator:GymOrchestrator"
            if solo
            else "orchestrators.game_orchestrator:GameOrchestrator"
        )
        one = {**self.model_dump(exclude={"count"}), "target": target}
        return [dict(one) for _ in range(self.count)]


class Timeouts(_Strict):
    """Every wait of the harness is bounded: seconds for each kind."""

    startup: float = 60.0  # a service answering its first call
    call: float = 30.0  # any one call, and each background operation
    episodes: float = 3600.0  # one episode block


class RunConfig(_Strict):
    """A run: the services it starts (or finds by URL) and what it does with them: episode
    blocks, single-agent training, game training, or a league (``orchestrator.env.league``)."""

    name: str = "run"  # the run's folder is runs/<name>-<time>
    orchestrator: OrchestratorSpec
    agents: list[AgentSpec] = Field(min_length=1)  # registered in this order
    episodes: Optional[list[EpisodeBlock]] = None  # default: one episode (no training)
    training: Optional[TrainingSpec] = None
    game_training: Optional[GameTrainingSpec] = None
    evaluation: Optional[GameEvaluation] = None  # games: after the run, and `mistk-rl eval`
    ladder: Optional[LadderSpec] = None  # games: a round robin of its agents, rated
    # a league's workers (orchestrator.env.league): game orchestrators, or a solo league's
    # gym orchestrators; started or given by URL
    # (or {count: N, ...}: `WorkerPool`)
    workers: list[ServiceSpec] = Field(default_factory=list)
    # a solo league's evaluations: the gym orchestrator its players are evaluated on
    # (default: started as the first worker is, or the gym orchestrator)
    evaluator: Optional[ServiceSpec] = None
    token: Optional[str] = None  # default: $MISTK_RL_TOKEN
    cluster: Optional[ClusterSpec] = None  # none: every service on this machine
    timeouts: Timeouts = Field(default_factory=Timeouts)

    @model_validator(mode="before")
    @classmethod
    def _worker_pool(cls, data: Any) -> Any:
        """``workers: {count: N, ...}`` as the list of N workers it stands for."""
        if isinstance(data, dict) and isinstance(data.get("workers"), dict):
            try:
                pool = WorkerPool.model_validate(data["workers"])
            except ValidationError as exc:
                raise ValueError(
                    "workers: "
                    + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                ) from None
            env = RunEnvSpec.model_validate(
                (data.get("orchestrator") or {}).get("env") or {"id": ""}
            )
            data = {**data, "workers": pool.specs(solo=env.solo_players() is not None)}
        return data

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        """What the schema cannot say field by field: what the run does (one of the modes),
        what a league asks of the rest, that evaluations name agents the run has. A config
        that gives no mode plays one episode."""
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ValueError(f"agent names must be unique, got {names}")
        given = self._modes_given()
        league = self.orchestrator.env.league
        solo = self.orchestrator.env.solo_players() if league is not None else None
        self._check_solo_league(league, solo)
        self._check_agents_of_mode(solo)
        if self.evaluation is not None:
            self._check_evaluation_names(self.evaluation, names)
        if self.ladder is not None:
            self._check_ladder(self.ladder, names)
        self._check_workers(league)
        if not given:
            self.episodes = [EpisodeBlock()]
        return self

    def _modes_given(self) -> list[str]:
        """The modes the config gives (at most one: play, train or train by games)."""
        given = [
            key
            for key in ("episodes", "training", "game_training", "ladder")
            if getattr(self, key) is not None
        ]
        if len(given) > 1:
            raise ValueError(
                "give one of 'episodes' (play), 'training' (train and "
                "evaluate), 'game_training' (games) or 'ladder' (a round robin), not "
                f"{' and '.join(given)}"
            )
        return given

    def _check_solo_league(
        self, league: Optional[dict[str, Any]], solo: Optional[list[str]]
    ) -> None:
        """A league trains by `training` only when solo (a solo league never by games),
        with one agent per player; `evaluator` is such a league's."""
        if league is not None and self.training is not None and solo is None:
            raise ValueError(
                "'training' with a league trains a solo league (every player of "
                "type solo); a league of players that play each other trains "
                "with 'game_training'"
            )
        if solo is not None and self.game_training is not None:
            raise ValueError("a solo league plays no games: train it with 'training'")
        if solo is not None and sorted(a.name for a in self.agents) != sorted(solo):
            raise ValueError(
                f"a solo league's agents are its players ({', '.join(solo)}), "
                f"one each, not {', '.join(a.name for a in self.agents)}"
            )
        if self.evaluator is not None and solo is None:
            raise ValueError("'evaluator' is a solo league's (its players' evaluations)")

    def _check_agents_of_mode(self, solo: Optional[list[str]]) -> None:
        """Training (not a solo league's) drives one agent; game training needs to know
        which agent's moves count (its evaluation's)."""
        if self.training is not None and solo is None and len(self.agents) != 1:
            raise ValueError("training drives exactly one agent")
        if self.game_training is not None and self.evaluation is None:
            raise ValueError(
                "game_training needs 'evaluation': its agent is the one "
                "whose moves count and who is evaluated"
            )

    def _check_evaluation_names(self, evaluation: GameEvaluation, names: list[str]) -> None:
        """The evaluation's agent and sampled opponents are agents of the run, and the stop
        targets name matchups the evaluation plays."""
        known = set(names)
        named = [evaluation.agent] + [m.opponent for m in evaluation.against if not m.exhaustive]
        missing = sorted({n for n in named if n not in known})
        if missing:
            raise ValueError(
                f"evaluation names agents {', '.join(missing)} that "
                f"'agents' does not list ({', '.join(names)})"
            )
        against = {m.opponent for m in evaluation.against}
        unknown = sorted(
            {t.opponent for t in (self.game_training.stop_when if self.game_training else ())}
            - against
        )
        if unknown:
            raise ValueError(
                f"game_training.stop_when names opponents "
                f"{', '.join(unknown)} the evaluation does not play"
            )

    def _check_ladder(self, ladder: LadderSpec, names: list[str]) -> None:
        """A ladder's players are distinct agents of the run, its anchor one of them, its
        groups disjoint sets of them."""
        missing = sorted(set(ladder.players) - set(names))
        if missing:
            raise ValueError(f"ladder.players names agents {', '.join(missing)} not in 'agents'")
        if len(set(ladder.players)) != len(ladder.players):
            raise ValueError(f"ladder.players lists a player twice: {ladder.players}")
        if ladder.anchor not in ladder.players:
            raise ValueError(f"ladder.anchor {ladder.anchor!r} is not one of ladder.players")
        members = [p for group in ladder.groups.values() for p in group]
        if ladder.groups and (len(ladder.groups) < 2 or not all(ladder.groups.values())):
            raise ValueError("ladder.groups: two groups or more, each of one player or more")
        unknown = [m for m in members if not member_players(m, ladder.players)]
        if unknown or len(set(members)) != len(members):
            raise ValueError(
                "ladder.groups: each member one of ladder.players (or a run whose checkpoints "
                "are, LABEL:step-N), in one group only "
                f"(given {ladder.groups})"
            )

    def _check_workers(self, league: Optional[dict[str, Any]]) -> None:
        """`workers` are a league's, and a league has some (here or in its own settings)."""
        if self.workers and league is None:
            raise ValueError("'workers' are a league's: orchestrator.env.league is not set")
        if league is not None and not self.workers and not league.get("workers"):
            raise ValueError(
                "a league needs 'workers' (game orchestrators, or a solo league's "
                "gym orchestrators) to play its jobs"
            )


def with_seed(config: RunConfig, seed: int) -> RunConfig:
    """The config with one seed for the whole run: the agents' ``hyperparameters.seed``
    (the first agent's is `seed`, the next ones' `seed` + 1, + 2, ...: independent streams,
    as a league's players need), ``training.seed``, each episode block's seed and a league's
    matchmaking seed. Evaluation seeds (``eval_seed``) stay, so evaluations of runs with
    different seeds play the same episodes."""
    if seed < 0:
        raise RunConfigError(f"seed must be >= 0, got {seed}")
    data = config.model_dump()
    for i, agent in enumerate(data["agents"]):
        agent["hyperparameters"]["seed"] = seed + i
    league = data["orchestrator"]["env"].get("league")
    if league is not None:
        league["seed"] = seed
    for training in ("training", "game_training"):
        if data[training] is not None:
            data[training]["seed"] = seed
    for block in data["episodes"] or []:
        block["seed"] = seed
    return RunConfig.model_validate(data)


class RunConfigError(ValueError):
    """The config file is missing, not YAML, or does not match the schema."""


def with_eval_episodes(config: RunConfig, episodes: int) -> RunConfig:
    """The config evaluating a single-agent run on `episodes` episodes (``mistk-rl eval
    --episodes``)."""
    if config.training is None:
        raise RunConfigError(
            "--episodes: only a single-agent run ('training' block) evaluates "
            "on episodes; a game config's evaluation is its 'evaluation' block"
        )
    if episodes < 1:
        raise RunConfigError(f"--episodes must be >= 1, got {episodes}")
    data = config.model_dump()
    data["training"]["eval_episodes"] = episodes
    return RunConfig.model_validate(data)


def with_cluster(config: RunConfig, address: str) -> RunConfig:
    """The config with its services placed on the Ray cluster at `address` (``--cluster``;
    the config's own ``cluster.data_root`` stays)."""
    data = config.model_dump()
    data["cluster"] = {**(data.get("cluster") or {}), "address": address}
    return RunConfig.model_validate(data)


def resume_config(
    run_dir: Path, config_path: Optional[Path] = None, seed: Optional[int] = None
) -> RunConfig:
    """The config the run in `run_dir` ran with (its saved ``config.yaml``), to resume it.

    `config_path` (with `seed`, as the run was started) may be given to check that it is the
    same run: any difference is an error naming the keys, since resuming continues the saved
    run as it was (to change it, edit ``RUN_DIR/config.yaml``). The token is never taken from
    the saved file: it comes from `config_path` or ``$MISTK_RL_TOKEN``, as in a new run.
    """
    saved = load_config(Path(run_dir) / "config.yaml")
    given = load_config(config_path) if config_path is not None else saved
    if seed is not None:
        given = with_seed(given, seed)
    differ = sorted(
        {
            key
            for key, _ in _flat(given.model_dump(exclude={"token"})).items()
            ^ _flat(saved.model_dump(exclude={"token"})).items()
        }
    )
    if differ:
        raise RunConfigError(
            f"{config_path or '--seed'} differs from {run_dir}/config.yaml in "
            f"{', '.join(differ)}: --resume continues the saved run (edit that "
            "file to change it)"
        )
    return saved.model_copy(update={"token": given.token if config_path else None})


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted.key: leaf value} of nested dicts and lists."""
    items: Iterable[tuple[Any, Any]]
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return {prefix: repr(data)}
    flat = {}
    for key, value in items:
        flat.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def load_config(path: Path) -> RunConfig:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise RunConfigError(f"cannot read config {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise RunConfigError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return RunConfig.model_validate(data or {})
    except ValidationError as exc:
        raise RunConfigError(f"{path}: {describe_errors(exc)}") from exc


def describe_errors(exc: ValidationError) -> str:
    """One line per problem, where it is and what; an unknown key names the keys known
    there and the closest one ("Did you mean ...?", as a hyperparameter's does)."""
    problems = []
    for error in exc.errors():
        where = ".".join(map(str, error["loc"])) or "(top)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            known = _known_keys(RunConfig, error["loc"][:-1])
            if known:
                message = (
                    f"unknown key (known here: {', '.join(known)})"
                    f"{suggest(str(error['loc'][-1]), known)}"
                )
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


def _known_keys(model: type[BaseModel], loc: tuple) -> Optional[list[str]]:
    """The keys the model at `loc` (field names, list indices, dict keys) takes."""
    annotation: Any = model
    for part in loc:
        annotation = model_in(annotation)
        if isinstance(part, int) or annotation is None:
            continue  # (a list item: the item's model is found at the next step)
        field = annotation.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
    found = model_in(annotation)
    return sorted(found.model_fields) if found is not None else None


def model_in(annotation: Any) -> Optional[type[BaseModel]]:
    """The pydantic model inside an annotation (Optional[X], list[X], X | None)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = model_in(arg)
        if found is not None:
            return found
    return None


__getattr__ = renamed(__name__, {"ConfigError": "RunConfigError"}, globals())  # 0.1's name
