"""What the gymnasium bridge is told: which orchestrator (one at a URL, or a target it
starts), its env spec, the env copies, the opponents of a game seat, and a timeout on every
wait. `BridgeSettings.of` takes the keyword arguments `gymnasium.make` passes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

GYM_ORCHESTRATOR = "orchestrators.gym_orchestrator:GymOrchestrator"
GAME_ORCHESTRATOR = "orchestrators.game_orchestrator:GameOrchestrator"
# startEpisode options the bridge sets itself: one run of endless episodes, trained on
# (the orchestrator sends the outcomes of actions only to an agent that learns)
OWNED_OPTIONS = frozenset({"numEpisodes", "numSteps", "numEnvs", "seed", "train", "agents"})
# numEpisodes of one run: training goes on until the caller closes (the spec's integers are
# 32-bit)
ENDLESS = 2**31 - 1


@dataclass(frozen=True)
class BridgeTimeouts:
    """Seconds each wait may take; a wait that runs out raises, naming what did not answer."""

    start: float = 60.0  # a service started here answering its first call
    call: float = 30.0  # one control call (initialize, registerAgent, start/stopEpisode)
    step: float = 60.0  # the orchestrator's next action request after an answer or a start
    # the orchestrator's wait for the caller's answer (its --agent-timeout when started
    # here; one at a URL has its operator's); the bridge's agent waits as long
    answer: float = 600.0
    health_every: float = 1.0  # while a wait goes on, check the services this often

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"timeouts.{f.name} must be > 0, not {getattr(self, f.name)!r}")


@dataclass(frozen=True)
class SeatOpponent:
    """An agent in a game's other seats: one at `url`, or a `target` started here."""

    name: str
    seats: tuple[str, ...]
    target: Optional[str] = None
    url: Optional[str] = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.target is None) == (self.url is None):
            raise ValueError(f"opponent {self.name!r}: give a target or a url (one of them)")
        if not self.seats:
            raise ValueError(f"opponent {self.name!r}: name the seats it holds")


@dataclass(frozen=True)
class BridgeSettings:
    """The bridge's settings (module doc). `episode`: more startEpisode options (maxSteps,
    envManager, envKwargs, stepTimeout, ...), under the spec's names."""

    env: dict[str, Any]  # initialize's env: {"id": ..., "kwargs": ..., "thinker": ...}
    url: Optional[str] = None  # an orchestrator that runs already; else `target` is started
    target: str = GYM_ORCHESTRATOR
    serve_args: tuple[str, ...] = ()  # more `mistk-rl serve` options for the started one
    token: Optional[str] = None  # the orchestrator's, when it has one
    num_envs: int = 1
    agent_name: str = "player"
    seat: Optional[str] = None  # games: the seat the caller plays
    opponents: tuple[SeatOpponent, ...] = ()
    episode: dict[str, Any] = field(default_factory=dict)
    episode_budget: int = ENDLESS
    timeouts: BridgeTimeouts = BridgeTimeouts()

    def __post_init__(self) -> None:
        if not isinstance(self.env, dict) or not isinstance(self.env.get("id"), str):
            raise ValueError(f"env: initialize's env spec, a dict with an 'id', not {self.env!r}")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, not {self.num_envs}")
        if not 1 <= self.episode_budget <= ENDLESS:
            raise ValueError(f"episode_budget must be in [1, {ENDLESS}]")
        owned = sorted(OWNED_OPTIONS & set(self.episode))
        if owned:
            raise ValueError(
                f"episode: {', '.join(owned)} are the bridge's own startEpisode options "
                "(num_envs, reset(seed=...) and episode_budget set them)"
            )

    @classmethod
    def of(
        cls,
        env: Union[str, dict[str, Any]],
        *,
        opponents: Any = (),
        timeouts: Union[BridgeTimeouts, dict[str, float], None] = None,
        serve_args: Any = (),
        **options: Any,
    ) -> "BridgeSettings":
        """Settings from plain values (a string env id; opponents and timeouts as dicts)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown bridge settings {unknown}; settings: {sorted(known)}")
        return cls(
            env={"id": env} if isinstance(env, str) else dict(env),
            opponents=tuple(
                o
                if isinstance(o, SeatOpponent)
                else SeatOpponent(**{**o, "seats": tuple(o["seats"])})
                for o in opponents
            ),
            timeouts=timeouts
            if isinstance(timeouts, BridgeTimeouts)
            else BridgeTimeouts(**(timeouts or {})),
            serve_args=tuple(serve_args),
            **options,
        )

    def orchestrator_args(self) -> list[str]:
        """`mistk-rl serve` options for an orchestrator started here: it waits for the
        caller as long as the bridge does, and may import the env's module (``MODULE:ID``:
        the caller who names it here is its operator)."""
        args = ["--agent-timeout", str(self.timeouts.answer)]
        module, _, _ = self.env["id"].rpartition(":")
        if module and module not in self.serve_args:
            args += ["--env-module", module]
        return args + list(self.serve_args)
