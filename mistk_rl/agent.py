"""`AbstractAgent`: the hooks an agent implements. The service calls them at the lifecycle's
transitions (see `mistk_rl.lifecycle.tables.AGENT`); an exception in any of them moves the
service to ``failed`` with the reason in status."""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.implementation import ServiceImplementation

Observations = dict[str, np.ndarray]
"""Observations keyed by entity name (an agent may control several entities)."""


@dataclass
class EpisodeInfo:
    """What episodeStarted carries."""

    obs: Observations
    mode: str  # "collect" (explore, learn) or "eval" (act greedily, no learning)
    episode: Optional[int] = None
    action_mask: Optional[Observations] = None
    epsilon: Optional[float] = None  # collect mode: explore with this, not the schedule


@dataclass
class ReplayBatch:
    """The transitions that followed the last actions, keyed by entity."""

    prev_obs: Observations
    actions: dict[str, np.ndarray]
    rewards: dict[str, float]
    new_obs: Observations
    terminated: dict[str, bool]
    truncated: dict[str, bool]
    new_action_mask: Optional[dict[str, np.ndarray]] = None  # legal actions in new_obs


def seed_hyperparameter(hparams: dict[str, Any]) -> Optional[int]:
    """The optional ``seed`` hyperparameter of a model-free agent (random, scripted)."""
    seed = hparams.get("seed")
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise ValueError(f"hyperparameter seed must be a non-negative int, got {seed!r}")
    return seed


def saved_seed(path: Optional[Path], seed: Optional[int]) -> Optional[int]:
    """The seed a model-free agent saved as its JSON "model" at `path`, else `seed`."""
    if path is None:
        return seed
    return json.loads(path.read_text()).get("seed", seed)


class AbstractAgent(ServiceImplementation, ABC):
    """Subclass and implement `do_get_action` and `do_save_model`; the other hooks default to
    doing nothing. Keep hook names distinct from trigger names (the service owns those)."""

    # steps run on the service's event loop (no thread hop); False if one blocks on I/O
    steps_inline: bool = True

    def __init__(self) -> None:
        super().__init__()
        self.name: Optional[str] = None
        self.observation_space: Optional[spaces.Space] = None
        self.action_space: Optional[spaces.Space] = None
        self.train: bool = True

    # ---- hooks ---------------------------------------------------------------------------
    def validate_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        """Raise `mistk_rl.errors.InvalidRequest` to refuse initialize with 400 (runs before
        any state change, so keep it quick): e.g. an unknown hyperparameter."""

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        """Read model properties and hyperparameters."""

    def do_build_model(self, path: Optional[Path]) -> None:
        """Build the model, or load it from `path` (inside the data dir) when given."""

    @abstractmethod
    def do_save_model(self, path: Path) -> None:
        """Save a checkpoint to `path` (inside the data dir); write it atomically."""

    def validate_registration(self, observation_space: Optional[spaces.Space],
                              action_space: Optional[spaces.Space]) -> None:
        """Raise `mistk_rl.errors.InvalidRequest` to refuse agentRegistered with 400 before
        any state change: e.g. an action space the agent cannot act in, or a model that
        would be over ``self.limits.max_model_params``."""

    def validate_registration_properties(self, properties: dict[str, Any]) -> None:
        """As `validate_registration`, for the orchestrator's properties (e.g. the game)."""

    def do_agent_registered(self, config: dict[str, Any]) -> None:
        """Registered with an orchestrator; `self.name` and the spaces are already set."""

    def validate_episode_start(self, episode: EpisodeInfo) -> None:
        """Refuse episodeStarted with InvalidRequest (400) before any state change; by
        default an `epsilon` (this agent has no epsilon-greedy exploration to set)."""
        if episode.epsilon is not None:
            raise InvalidRequest(f"epsilon: {type(self).__name__} has no epsilon-greedy "
                                 "exploration to set")

    def do_episode_started(self, episode: EpisodeInfo) -> None:
        """An episode starts."""

    @abstractmethod
    def do_get_action(self, obs: Observations,
                      action_mask: Optional[Observations] = None) -> dict[str, Any]:
        """One action per entity in `obs` (numbers, lists or numpy arrays)."""

    def do_replay_action(self, batch: ReplayBatch) -> None:
        """Learn from the transitions that followed the last actions."""

    def do_episode_stopped(self) -> None:
        """The episode is over."""

    def do_reset(self, unload_model: bool) -> None:
        """Back to the initial state; drop the model when `unload_model`."""

    def do_terminate(self) -> None:
        """Release resources; the service answers only status afterwards."""
