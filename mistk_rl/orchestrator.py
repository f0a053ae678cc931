"""`AbstractOrchestrator`: the hooks an environment orchestrator implements. The service
registers agents (calling their agentRegistered), keeps their clients in `self.agents`, and
calls these hooks at the lifecycle's transitions (`mistk_rl.lifecycle.tables.ORCHESTRATOR`)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistk_rl.client import AgentClient
from mistk_rl.files import atomic_write_json
from mistk_rl.implementation import ServiceImplementation
from mistk_rl.schemas import EpisodeConfig


@dataclass
class RegisteredAgent:
    name: str
    url: str
    skip_train: bool
    client: AgentClient
    capabilities: frozenset[str] = frozenset()  # from the agent's apiVersion, e.g. "step"


class AbstractOrchestrator(ServiceImplementation, ABC):
    """Subclass and implement `do_initialize`, `agent_config` and `do_start_episode`."""

    def __init__(self) -> None:
        super().__init__()
        self.agents: dict[str, RegisteredAgent] = {}
        self.agents_needed: int = 1
        self.results: list[dict[str, Any]] = []
        self.env_steps = 0  # since initialize; implementations add the steps they take
        # modules envs may be imported from (`mistk-rl serve --env-module`); any other env
        # must be registered already (importing a module a caller names runs its code)
        self.env_modules: frozenset[str] = frozenset()

    # ---- for implementations -------------------------------------------------------------
    def record_episode(self, agent: str, episode_return: float, length: int,
                       **extra: Any) -> dict[str, Any]:
        """Append one finished episode to the results (and the status payload)."""
        result = {"episode": len(self.results), "agent": agent,
                  "return": float(episode_return), "length": int(length),
                  "envSteps": self.env_steps, **extra}
        self.results.append(result)
        self.update_status({"episodesDone": len(self.results), "lastEpisode": result})
        return result

    # ---- hooks ---------------------------------------------------------------------------
    def validate_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        """Raise `mistk_rl.errors.InvalidRequest` to refuse initialize with 400 (runs before
        any state change, so keep it quick)."""

    def validate_start_episode(self, config: EpisodeConfig) -> None:
        """Raise `mistk_rl.errors.InvalidRequest` to refuse startEpisode with 400 before any
        state change (e.g. more env processes than ``self.limits`` allows)."""

    @abstractmethod
    def do_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        """Create the environment from `env` (``{"id": ..., "kwargs": {...}}``)."""

    def agent_config(self, name: str) -> dict[str, Any]:
        """What to tell agent `name` at registration (its spaces), in the spec's AgentConfig
        keys: observationSpace, actionSpace, properties."""
        return {}

    def do_register_agent(self, agent_name: str, agent_url: str, skip_train: bool) -> None:
        """Agent `agent_name` accepted the registration and is in `self.agents`."""

    @abstractmethod
    def do_start_episode(self, config: EpisodeConfig) -> None:
        """Run the episodes `config` asks for; check `self.should_stop` every step."""

    def do_save_episode(self, path: Path) -> None:
        """Save the finished episodes; by default their results as JSON."""
        atomic_write_json(path, {"episodes": self.results})

    def do_stop_episode(self) -> None:
        """The episode run is over (finished, or cancelled by stopEpisode)."""

    def do_reset(self) -> None:
        """Back to uninitialized (the service resets the agents and forgets them)."""

    def do_terminate(self) -> None:
        """Release resources (close the environment)."""
