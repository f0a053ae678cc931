"""League players: who plays whom, when a player is snapshotted, and what a snapshot does to it.

The structure and names follow nervex (the league of the seed), the snapshot predicate
DI-engine, and the thresholds, weightings and verification filter the AlphaStar pseudocode.
Pinned choices:

- `MainPlayer`: pfsp 0.5 (`squared` over every historical player), self-play 0.35,
  verification 0.15. Self-play and verification draw one main opponent (uniformly, itself
  included), and, as in AlphaStar, a verification that finds nothing to verify plays
  self-play against that same opponent. Self-play: the opponent itself when the win
  rate against it is above 1 - 0.7, else its snapshots by `variance`. Verification: the main
  exploiters' snapshots by `squared` if the player is below 0.3 against one of them, else the
  opponent's snapshots (trailing monotonic run dropped) by `squared` if below 0.7 against one.
- `MainExploiter`: a uniformly drawn main player if its win rate against it is above 0.1,
  else that main player's snapshots by `variance`; trained enough against the active main
  players; reset to its initial weights at every snapshot.
- `LeagueExploiter`: pfsp `linear_capped` over every historical player; trained enough against
  them; reset with probability 0.25 at a snapshot.
- `is_trained_enough` is a pure predicate over the player's env steps since its last
  snapshot: False below one phase, True from two, in between True when its lowest win rate
  against the opponents of its type is above 0.7 (strict). `mark_snapshot` moves the counter.
- A snapshot's id is unique even at equal steps (the league's sequence number is in it) and
  its parent id is the active player's id exactly.
- Fixed opponents (`HistoricalPlayer.fixed`) count among the historical players wherever
  those do (PFSP, the early-snapshot predicate); having no parent, they are nobody's
  snapshots for self-play and verification.
- `fixed` (a branch any battle player may be given, in none by default): PFSP (`squared`)
  over the fixed opponents alone, so they keep their share of the player's games however
  many snapshots PFSP weighs them against; with no fixed opponent it is the pfsp branch
  over every historical player.

An empty candidate list raises `NoCandidates`; the league avoids it by starting with a
snapshot of every main player.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional, Protocol, Sequence

import numpy as np

from mistk_rl.league.payoff import BattleSharedPayoff
from mistk_rl.league.pfsp import NoCandidates, pfsp, remove_monotonic_suffix
from mistk_rl.registry import Registry

STRONG_WIN_RATE = 0.7
# every ActivePlayer subclass with a `kind` is one (declared by writing the class): league
# configs name players by it, and the spec's enum, the request models and league.json read it
PLAYER_TYPES: Registry[type["ActivePlayer"]] = Registry("league_players", "league player type")


@dataclass
class Player:
    player_id: str
    category: str  # what it plays as (a game, a race); players meet within a category
    checkpoint_path: str
    total_agent_step: int = 0  # its env steps (moves)


@dataclass
class HistoricalPlayer(Player):
    """A frozen snapshot of an active player; or, `fixed`, an opponent the league plays as
    it is (a scripted player, or a policy trained elsewhere): its own agent plays it, with
    no checkpoint to load and no parent, and PFSP weighs it as any snapshot, so a main
    player meets most often the fixed opponents it loses to."""

    parent_id: str = ""
    fixed: bool = False


class LeagueView(Protocol):
    """What matchmaking reads of the league."""

    payoff: BattleSharedPayoff

    @property
    def historical_players(self) -> Sequence[HistoricalPlayer]: ...

    @property
    def active_players(self) -> Sequence["ActivePlayer"]: ...


@dataclass
class Job:
    """One job: `launch_player` (home) against `opponent`, chosen by `branch`."""

    launch_player: str
    opponent: str
    branch: str
    # a solo job's startEpisode settings (EpisodeConfig, camelCase): what a gym
    # orchestrator plays it with
    settings: dict = field(default_factory=dict)


@dataclass
class ActivePlayer(Player):
    """A player that trains. Subclasses set `branches` (name -> probability, in order) and
    implement `_<name>_branch`, and say who counts for `is_trained_enough`."""

    kind: ClassVar[str]  # its type in league configs (registers the class)

    one_phase_step: int = 20_000
    strong_win_rate: float = STRONG_WIN_RATE
    initial_checkpoint: str = ""  # what a reset reloads
    last_enough_step: int = 0
    branches: dict[str, float] = field(default_factory=dict)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            PLAYER_TYPES.add(cls.kind, cls)

    def __post_init__(self) -> None:
        if not self.branches:
            self.branches = dict(self.default_branches())
        total = sum(self.branches.values())
        if abs(total - 1.0) > 1e-6 or min(self.branches.values()) < 0:
            raise ValueError(
                f"{type(self).__name__} {self.player_id}: branch probabilities "
                f"must be non-negative and sum to 1, not {self.branches}"
            )
        missing = [b for b in self.branches if b not in self.available_branches()]
        if missing:
            raise ValueError(f"{type(self).__name__} has no branch {missing}")

    @classmethod
    def default_branches(cls) -> dict[str, float]:
        return {}

    @classmethod
    def available_branches(cls) -> list[str]:
        """Every branch it can be given: its type's default ones first, then the others."""
        names = [
            n[1 : -len("_branch")]
            for n in dir(cls)
            if n.startswith("_") and n.endswith("_branch") and n != "_branch"
        ]
        default = list(cls.default_branches())
        return default + sorted(set(names) - set(default))

    # ---- snapshots -----------------------------------------------------------------------
    def snapshot_opponents(self, league: LeagueView) -> list[Player]:
        """The players whose win rates decide an early snapshot."""
        return list(self._historical(league))

    def is_trained_enough(self, league: LeagueView) -> bool:
        """Pure: whether a snapshot is due (module doc)."""
        steps = self.total_agent_step - self.last_enough_step
        if steps < self.one_phase_step:
            return False
        if steps >= 2 * self.one_phase_step:
            return True
        opponents = [p.player_id for p in self.snapshot_opponents(league)]
        if not opponents:
            return False
        return bool(league.payoff.win_rates(self.player_id, opponents).min() > self.strong_win_rate)

    def mark_snapshot(self) -> None:
        self.last_enough_step = self.total_agent_step

    def snapshot(self, sequence: int, checkpoint_path: str) -> HistoricalPlayer:
        """A frozen copy at this step; `sequence` (the league's count of snapshots) keeps
        ids unique when two snapshots share a step."""
        return HistoricalPlayer(
            self.snapshot_id(sequence),
            self.category,
            checkpoint_path,
            self.total_agent_step,
            parent_id=self.player_id,
        )

    def snapshot_id(self, sequence: int) -> str:
        return f"{self.player_id}_{self.total_agent_step}_{sequence}"

    def reset_on_snapshot(self, rng: np.random.Generator) -> bool:
        """Whether this player goes back to its initial weights after its snapshot."""
        return False

    # ---- matchmaking ---------------------------------------------------------------------
    def choose_opponent(self, league: LeagueView, rng: np.random.Generator) -> Job:
        names = list(self.branches)
        cumulative = np.cumsum([self.branches[n] for n in names])
        u = rng.random()
        branch = names[min(int(np.searchsorted(cumulative, u, side="right")), len(names) - 1)]
        return getattr(self, f"_{branch}_branch")(league, rng)

    def _job(self, opponent: Player, branch: str) -> Job:
        return Job(self.player_id, opponent.player_id, branch)

    def _pfsp(
        self,
        candidates: Sequence[Player],
        league: LeagueView,
        rng: np.random.Generator,
        weighting: str,
    ) -> Player:
        if not candidates:
            raise NoCandidates(f"{self.player_id}: no candidate opponents")
        rates = league.payoff.win_rates(self.player_id, [c.player_id for c in candidates])
        return pfsp(list(candidates), rates, rng, weighting)

    def _historical(self, league: LeagueView) -> list[HistoricalPlayer]:
        return [p for p in league.historical_players if p.category == self.category]

    def _snapshots_of(self, parent: str, league: LeagueView) -> list[HistoricalPlayer]:
        return [p for p in self._historical(league) if p.parent_id == parent]


@dataclass
class SoloActivePlayer(ActivePlayer):
    """Trains alone (single-agent envs): every job is against the env, with the seed's solo
    job settings: env kwargs, env copies, episodes, and an epsilon decaying exponentially
    with the player's steps, ``(start - end) * exp(-steps / decay) + end`` (nervex's
    formula; its yaml: .95 -> .05 over 10,000). `Job.settings` is the EpisodeConfig a gym
    orchestrator runs the job with (``startEpisode(job.settings)``). A snapshot is due every
    `one_phase_step` of its env steps."""

    kind = "solo"
    env_kwargs: dict = field(default_factory=dict)
    num_envs: int = 8
    episodes_per_job: int = 2
    eps_start: float = 0.95
    eps_end: float = 0.05
    eps_decay: int = 10_000  # env steps; 0: no epsilon (an agent without epsilon-greedy)

    @classmethod
    def default_branches(cls) -> dict[str, float]:
        return {"solo": 1.0}

    def is_trained_enough(self, league: LeagueView) -> bool:
        """Pure: a snapshot is due every `one_phase_step` env steps (the seed's solo rule:
        there are no opponents whose win rates could make it earlier)."""
        return self.total_agent_step - self.last_enough_step >= self.one_phase_step

    def epsilon(self) -> float:
        return float(
            (self.eps_start - self.eps_end) * np.exp(-self.total_agent_step / self.eps_decay)
            + self.eps_end
        )

    def _solo_branch(self, league: LeagueView, rng: np.random.Generator) -> Job:
        agent: dict = {"mode": "collect", "train": True}
        if self.eps_decay:
            agent["epsilon"] = round(self.epsilon(), 6)
        settings = {
            "numEnvs": self.num_envs,
            "numEpisodes": self.episodes_per_job,
            "train": True,
            "agents": {self.player_id: agent},
        }
        if self.env_kwargs:
            settings["envKwargs"] = dict(self.env_kwargs)
        return Job(self.player_id, "", "solo", settings)


@dataclass
class BattleActivePlayer(ActivePlayer):
    """Trains by playing other players."""

    # at a reset, forget its records (`BattleSharedPayoff.forget`): without it a main
    # exploiter whose record against the main player fell under .1 plays the main's
    # snapshots for good, every reset after (that record only changes when they play)
    forget_on_reset: bool = False

    def _mains(self, league: LeagueView) -> list["MainPlayer"]:
        return [
            p
            for p in league.active_players
            if isinstance(p, MainPlayer) and p.category == self.category
        ]

    def _random_main(self, league: LeagueView, rng: np.random.Generator) -> "MainPlayer":
        mains = self._mains(league)
        return mains[int(rng.integers(len(mains)))]

    def _fixed_branch(self, league: LeagueView, rng: np.random.Generator) -> Job:
        fixed = [p for p in self._historical(league) if p.fixed]
        return self._job(
            self._pfsp(fixed or self._historical(league), league, rng, "squared"), "fixed"
        )

    def _opponent_or_its_snapshots(
        self,
        opponent: Player,
        above: float,
        branch: str,
        league: LeagueView,
        rng: np.random.Generator,
    ) -> Job:
        """`opponent` while this player wins more than `above` against it; else one of
        its snapshots, by `variance` (the ones it is even with)."""
        if league.payoff.win_rate(self.player_id, opponent.player_id) > above:
            return self._job(opponent, branch)
        snapshots = self._snapshots_of(opponent.player_id, league)
        return self._job(self._pfsp(snapshots, league, rng, "variance"), branch)


@dataclass
class MainPlayer(BattleActivePlayer):
    kind = "main"

    @classmethod
    def default_branches(cls) -> dict[str, float]:
        return {"pfsp": 0.5, "sp": 0.35, "verification": 0.15}

    def _pfsp_branch(self, league: LeagueView, rng: np.random.Generator) -> Job:
        return self._job(self._pfsp(self._historical(league), league, rng, "squared"), "pfsp")

    def _sp_branch(self, league: LeagueView, rng: np.random.Generator) -> Job:
        return self._self_play(self._random_main(league, rng), league, rng)

    def _verification_branch(self, league: LeagueView, rng: np.random.Generator) -> Job:
        opponent = self._random_main(league, rng)
        return self._verify(opponent, league, rng) or self._self_play(opponent, league, rng)

    def _self_play(
        self, opponent: "MainPlayer", league: LeagueView, rng: np.random.Generator
    ) -> Job:
        return self._opponent_or_its_snapshots(
            opponent, 1 - self.strong_win_rate, "sp", league, rng
        )

    def _verify(
        self, opponent: "MainPlayer", league: LeagueView, rng: np.random.Generator
    ) -> Optional[Job]:
        exploiters = {p.player_id for p in league.active_players if isinstance(p, MainExploiter)}
        beaten_by = [p for p in self._historical(league) if p.parent_id in exploiters]
        if beaten_by:
            rates = league.payoff.win_rates(self.player_id, [p.player_id for p in beaten_by])
            if rates.min() < 1 - self.strong_win_rate:
                return self._job(self._pfsp(beaten_by, league, rng, "squared"), "verification")
        snapshots = self._snapshots_of(opponent.player_id, league)
        rates = league.payoff.win_rates(self.player_id, [p.player_id for p in snapshots])
        kept, snapshots = remove_monotonic_suffix(list(rates), snapshots)
        if snapshots and min(kept) < self.strong_win_rate:
            return self._job(self._pfsp(snapshots, league, rng, "squared"), "verification")
        return None


@dataclass
class MainExploiter(BattleActivePlayer):
    kind = "main_exploiter"
    min_valid_win_rate: float = 0.1

    @classmethod
    def default_branches(cls) -> dict[str, float]:
        return {"main_players": 1.0}

    def _main_players_branch(self, league: LeagueView, rng: np.random.Generator) -> Job:
        return self._opponent_or_its_snapshots(
            self._random_main(league, rng), self.min_valid_win_rate, "main_players", league, rng
        )

    def snapshot_opponents(self, league: LeagueView) -> list[Player]:
        return list(self._mains(league))

    def reset_on_snapshot(self, rng: np.random.Generator) -> bool:
        return True


@dataclass
class LeagueExploiter(BattleActivePlayer):
    kind = "league_exploiter"
    mutate_prob: float = 0.25

    @classmethod
    def default_branches(cls) -> dict[str, float]:
        return {"pfsp": 1.0}

    def _pfsp_branch(self, league: LeagueView, rng: np.random.Generator) -> Job:
        return self._job(self._pfsp(self._historical(league), league, rng, "linear_capped"), "pfsp")

    def reset_on_snapshot(self, rng: np.random.Generator) -> bool:
        return bool(rng.random() < self.mutate_prob)


def solo_players(types: dict[str, str]) -> Optional[list[str]]:
    """Which kind of league players of these registered types (id -> type) make: the ids
    when every one trains alone (a solo league: gym orchestrator workers), None when every
    one plays the others (a battle league: game orchestrator workers); ValueError naming
    both for a mix."""
    solo = [pid for pid, kind in types.items() if issubclass(PLAYER_TYPES[kind], SoloActivePlayer)]
    if not solo:
        return None
    if len(solo) < len(types):
        battle = [pid for pid in types if pid not in solo]
        raise ValueError(
            f"a league is solo (players training alone on gym orchestrator "
            f"workers) or battle (players playing each other on game "
            f"orchestrator workers), not a mix: solo {solo}, battle {battle}"
        )
    return solo
