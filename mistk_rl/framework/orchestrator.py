"""`AbstractOrchestrator`: the hooks an environment orchestrator implements. The service
registers agents (calling their agentRegistered), keeps their clients in `self.agents`, and
calls these hooks at the lifecycle's transitions (`mistk_rl.lifecycle.tables.ORCHESTRATOR`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.episode_log import EpisodeLog
from mistk_rl.framework.implementation import PROGRESS_EVERY_S, Metric, ServiceImplementation
from mistk_rl.sdk.client import AgentClient
from mistk_rl.sdk.schemas import EnvSpec, EpisodeSettings
from mistk_rl.sdk.stepping import LocalInference, replay_batch

RECENT_EPISODES = 100  # the episodes /metrics' mean return is over


@dataclass
class RegisteredAgent:
    name: str
    url: str
    skip_train: bool
    client: AgentClient
    capabilities: frozenset[str] = frozenset()  # from the agent's apiVersion, e.g. "step"
    seats: tuple[str, ...] = ()  # games: the seats it holds (GameOrchestrator)


class AbstractOrchestrator(ServiceImplementation, ABC):
    """Subclass and implement `do_initialize`, `agent_config` and `do_start_episode`."""

    # the settings a subclass takes: initialize's env and startEpisode's options (a key of
    # another orchestrator's is a 400 naming it; the spec lists every orchestrator's)
    env_settings: ClassVar[type[EnvSpec]] = EnvSpec
    episode_settings: ClassVar[type[EpisodeSettings]] = EpisodeSettings
    # runs agents' policy copies next to its envs (agents' localInference setting)
    local_inference: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.agents: dict[str, RegisteredAgent] = {}
        self.agents_needed: int = 1
        # the finished episodes since initialize, on disk (a long run's grow without bound)
        self.results = EpisodeLog()
        self.env_steps = 0  # since initialize; implementations add the steps they take
        # per agent, for /metrics: episodes ended since the service started, and the
        # returns of the last `RECENT_EPISODES` (`results` are on disk)
        self.episodes_ended: dict[str, int] = {}
        self.recent_returns: dict[str, deque[float]] = {}
        # modules envs may be imported from (`mistk-rl serve --env-module`); any other env
        # must be registered already (importing a module a caller names runs its code)
        self.env_modules: frozenset[str] = frozenset()

    # ---- for implementations -------------------------------------------------------------
    def play_settings(self, config: EpisodeSettings, agent: RegisteredAgent) -> tuple[str, bool]:
        """(mode, train) of `agent` in this call: its entry in ``config.agents`` over the
        call's defaults. A skipTrain agent never trains; an agent in eval mode never does."""
        settings = config.agents.get(agent.name)
        train = config.train if settings is None or settings.train is None else settings.train
        train = train and not agent.skip_train
        mode = (
            settings.mode
            if settings is not None and settings.mode
            else ("collect" if train else "eval")
        )
        return mode, train and mode == "collect"

    def exploration(self, config: EpisodeSettings, agent: RegisteredAgent) -> Optional[float]:
        """The epsilon `agent` explores with in this call (``config.agents``), if set."""
        settings = config.agents.get(agent.name)
        return settings.epsilon if settings is not None else None

    def validate_agent_settings(self, config: EpisodeSettings) -> None:
        """Refuse ``config.agents`` entries naming no registered agent, or asking an agent
        to train while acting greedily (eval mode never learns)."""
        unknown = sorted(set(config.agents) - set(self.agents))
        if unknown:
            raise InvalidRequest(
                f"agents: {', '.join(map(repr, unknown))} "
                f"{'is' if len(unknown) == 1 else 'are'} not registered "
                f"(registered: {', '.join(sorted(self.agents)) or 'none'})"
            )
        for name, settings in config.agents.items():
            if settings.mode == "eval" and settings.train:
                raise InvalidRequest(
                    f"agents[{name!r}]: mode eval never learns; train needs mode collect"
                )
            if settings.local_inference is not None:
                if not self.local_inference:
                    raise InvalidRequest(
                        f"agents[{name!r}].localInference: "
                        f"{type(self).__name__} does not run policy copies"
                    )
                if "local" not in self.agents[name].capabilities:
                    raise InvalidRequest(
                        f"agents[{name!r}].localInference: the agent offers "
                        "no policy copy (it does not list the capability "
                        "'local')"
                    )

    def local_inference_settings(
        self, config: EpisodeSettings, agent: RegisteredAgent
    ) -> Optional[LocalInference]:
        """How `agent` acts here with a copy of its policy in this call, if it does."""
        settings = config.agents.get(agent.name)
        local = settings.local_inference if settings is not None else None
        return None if local is None else LocalInference(local.sync_every, local.batch_steps)

    def record_episode(
        self,
        agent: str,
        episode_return: float,
        length: int,
        every_s: float = PROGRESS_EVERY_S,
        **extra: Any,
    ) -> dict[str, Any]:
        """Append one finished episode to the results and the status payload, which shows it
        at once; long-polls wake for it at most every `every_s` seconds, as for per-step
        progress: games end thousands of times a second and a random CartPole episode every
        few ms, and each wake costs every waiting caller a round trip and the step loop the
        GIL (the worker's event loop answers them)."""
        result = {
            "episode": len(self.results),
            "agent": agent,
            "return": float(episode_return),
            "length": int(length),
            "envSteps": self.env_steps,
            **extra,
        }
        self.results.append(result)
        self.episodes_ended[agent] = self.episodes_ended.get(agent, 0) + 1
        recent = self.recent_returns.get(agent)
        if recent is None:
            recent = self.recent_returns[agent] = deque(maxlen=RECENT_EPISODES)
        recent.append(result["return"])
        self.update_status({"episodesDone": len(self.results), "lastEpisode": result}, every_s)
        return result

    def metrics(self) -> list[Metric]:
        """Env steps since initialize, and per agent the episodes ended and their returns."""
        samples = [
            Metric(
                "env_steps_total",
                "counter",
                "Env steps taken since the orchestrator was initialized",
                self.env_steps,
            )
        ]
        for agent, episodes in self.episodes_ended.items():
            labels, recent = (("agent", agent),), self.recent_returns[agent]
            samples += [
                Metric("episodes_total", "counter", "Episodes ended", episodes, labels),
                Metric(
                    "episode_return_last", "gauge", "The last episode's return", recent[-1], labels
                ),
                Metric(
                    "episode_return_mean",
                    "gauge",
                    f"The mean return of the last {RECENT_EPISODES} episodes",
                    sum(recent) / len(recent),
                    labels,
                ),
            ]
        return samples

    def act(
        self,
        agent: RegisteredAgent,
        obs: dict[str, Any],
        replay: dict[str, dict],
        masks: Optional[dict[str, Any]],
    ) -> dict[str, Any]:
        """One request for all of `agent`'s entities that must act: `step` (with the
        transitions in `replay`, entity -> `mistk_rl.sdk.stepping.REPLAY_FIELDS`) when the
        agent offers it, else replayAction then getAction."""
        if "step" in agent.capabilities:
            return agent.client.step(
                obs, replay=replay_batch(replay) if replay else None, action_mask=masks
            )
        if replay:
            agent.client.replay_action(replay_batch(replay))
        return agent.client.get_action(obs, masks)

    def league_view(self) -> Optional[dict[str, Any]]:
        """GET /league's answer; None (404) for an orchestrator that runs no league."""
        return None

    def extra_results(self) -> dict[str, Any]:
        """getResults' fields beyond the episodes (games: totals, evaluations)."""
        return {}

    # ---- hooks ---------------------------------------------------------------------------
    def validate_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        """Raise `mistk_rl.errors.InvalidRequest` to refuse initialize with 400 (runs before
        any state change, so keep it quick). `env` holds `env_settings`' keys only."""

    def validate_start_episode(self, config: EpisodeSettings) -> None:
        """Raise `mistk_rl.errors.InvalidRequest` to refuse startEpisode with 400 before any
        state change (e.g. more env processes than ``self.limits`` allows)."""

    @abstractmethod
    def do_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        """Create the environment from `env` (``{"id": ..., "kwargs": {...}}``)."""

    def validate_register_agent(
        self, name: str, seats: tuple[str, ...], skip_train: bool = False
    ) -> tuple[str, ...]:
        """Check registerAgent's `seats` (empty: not given) before the agent is asked;
        return the seats the agent will hold. Raise InvalidRequest to refuse with 400."""
        if seats:
            raise InvalidRequest(
                f"{type(self).__name__} has no seats: registerAgent takes seats only for games"
            )
        return ()

    def agent_config(self, name: str, seats: tuple[str, ...] = ()) -> dict[str, Any]:
        """What to tell agent `name` (holding `seats`) at registration, in the spec's
        AgentConfig keys: observationSpace, actionSpace, properties."""
        return {}

    def do_register_agent(self, agent_name: str, agent_url: str, skip_train: bool) -> None:
        """Agent `agent_name` accepted the registration and is in `self.agents`."""

    @abstractmethod
    def do_start_episode(self, config: EpisodeSettings) -> None:
        """Run the episodes `config` asks for; check `self.should_stop` every step."""

    def do_save_episode(self, path: Path) -> None:
        """Save the finished episodes; by default their results as JSON."""
        self.results.save(path)

    def do_stop_episode(self) -> None:
        """The episode run is over (finished, or cancelled by stopEpisode)."""

    def do_reset(self) -> None:
        """Back to uninitialized (the service resets the agents and forgets them)."""

    def do_terminate(self) -> None:
        """Release resources (close the environment)."""


def episode_quotas(limit: Optional[int], n: int) -> list[float]:
    """Episodes each env copy plays: `limit` split evenly (the remainder to the first), so
    copies with short episodes cannot crowd out the others (with E copies, the first N
    episodes to finish over-represent short ones); unlimited without a limit."""
    if limit is None:
        return [float("inf")] * n
    base, extra = divmod(limit, n)
    return [base + (1 if i < extra else 0) for i in range(n)]
