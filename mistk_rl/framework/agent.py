"""`AbstractAgent`: the hooks an agent implements. The service calls them at the lifecycle's
transitions (see `mistk_rl.lifecycle.tables.AGENT`); an exception in any of them moves the
service to ``failed`` with the reason in status."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl._moved import renamed
from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.implementation import ServiceImplementation
from mistk_rl.wire.columns import Columns
from mistk_rl.wire.step_columns import Acting, Transitions  # (the agent's view of a step)

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


@dataclass
class Acted:
    """An agent's answer to `Acting`: an action per row and, optionally, per-row arrays it
    wants back with each transition (what the model said: log-prob, value, ...). The
    service keeps both under the row's step id (`mistk_rl.service.steps`)."""

    actions: np.ndarray  # [N, ...]
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [N, ...]


@dataclass
class PolicyDescription:
    """What acting with a copy of an agent's policy takes (local inference: `getPolicy`,
    and the weights a `replayColumns` answer brings)."""

    policy: str  # the policy's name (`mistk_rl.rl.actor.POLICIES`)
    config: dict[str, Any]  # its config, merged
    observation_space: dict[str, Any]  # the spaces, as the spec writes them
    action_space: dict[str, Any]
    seed: Optional[int]
    env_steps: int  # the env steps the agent has learned from
    warmup_until: int  # act uniformly at random until this many env steps (a replay's start)
    version: int  # the learner updates behind these weights
    extras: dict[str, tuple[int, ...]]  # what each transition carries of the model's output
    optional_extras: list[str]  # ... of which these may be missing
    weights: Optional[dict[str, np.ndarray]] = None  # None: not asked for


def rounds(keys: list) -> list[list[int]]:
    """Rows grouped so that no key repeats within a group, in order: the k-th row of each
    key goes to group k (experience from local inference holds several steps per env copy,
    in time order; a learner takes one step per entity at a time)."""
    seen: dict[Any, int] = {}
    groups: list[list[int]] = []
    for row, key in enumerate(keys):
        k = seen.get(key, 0)
        seen[key] = k + 1
        if k == len(groups):
            groups.append([])
        groups[k].append(row)
    return groups


def rows_to_map(names: list[str], columns: Columns) -> dict[str, Any]:
    """Columns -> entity -> row (a Dict space's: entity -> {key: row})."""
    if isinstance(columns, dict):
        return {
            name: {key: column[i] for key, column in columns.items()}
            for i, name in enumerate(names)
        }
    return dict(zip(names, columns))


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
    """Subclass and implement `do_get_action` (or its columnar form `do_act`) and
    `do_save_model`; the other hooks default to doing nothing (`do_learn` hands
    `do_replay_action` what it learns from). Keep hook names distinct from trigger names
    (the service owns those)."""

    # steps run on the service's event loop (no thread hop); False if one blocks on I/O
    steps_inline: bool = True
    # a caller may act with a copy of the policy (`do_policy_copy`) and send experience
    # (`do_learn` with the extras the copy declares): capability "local"
    local_inference: bool = False

    def __init__(self) -> None:
        cls = type(self)
        if cls.do_get_action is AbstractAgent.do_get_action and cls.do_act is AbstractAgent.do_act:
            raise TypeError(f"{cls.__name__} must implement do_get_action or do_act")
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

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
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
            raise InvalidRequest(
                f"epsilon: {type(self).__name__} has no epsilon-greedy exploration to set"
            )

    def do_episode_started(self, episode: EpisodeInfo) -> None:
        """An episode starts."""

    def do_get_action(
        self, obs: Observations, action_mask: Optional[Observations] = None
    ) -> dict[str, Any]:
        """One action per entity in `obs` (numbers, lists or numpy arrays). Implement this
        or `do_act` (the columnar form, which the service calls)."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither do_get_action nor do_act"
        )

    def do_replay_action(self, batch: ReplayBatch) -> None:
        """Learn from the transitions that followed the last actions."""

    # ---- the columnar hooks: what the service calls (defaults: the entity-keyed hooks) ----
    def do_act(self, batch: Acting) -> Acted:
        """One action per row. Override to act on the columns directly (one forward pass,
        no per-row Python); the default asks `do_get_action` with entity-keyed dicts."""
        names = batch.row_names(self.name)
        mask = None if batch.action_mask is None else dict(zip(names, batch.action_mask))
        actions = self.do_get_action(rows_to_map(names, batch.obs), mask)
        missing = [name for name in names if name not in actions]
        if missing:
            raise ValueError(f"do_get_action answered no action for {missing[:3]}")
        return Acted(np.asarray([actions[name] for name in names]))

    def do_learn(self, transitions: Transitions) -> Optional[Callable[[], None]]:
        """Learn from rows of transitions. Override to take the columns directly; the
        default hands `do_replay_action` an entity-keyed `ReplayBatch`.

        An override may return a callable: the part of the learning that can wait until
        the answer to this step is out (a step that also acts answers first, and the work
        runs while the caller steps its envs; it always runs before the agent's next hook).
        Do at once what acting on the next rows reads (an env-step count that drives
        exploration, say); return the rest (storing, updates). Any other value returned is
        ignored, as it always was."""
        if type(self).do_replay_action is AbstractAgent.do_replay_action:
            return None  # an agent that does not learn (the default do_replay_action)
        names = transitions.row_names(self.name)
        for rows in rounds(names) if len(set(names)) < len(names) else [None]:
            part = transitions if rows is None else transitions.take(np.asarray(rows))
            keys = names if rows is None else [names[i] for i in rows]
            self.do_replay_action(
                ReplayBatch(
                    prev_obs=rows_to_map(keys, part.obs),
                    actions=dict(zip(keys, part.actions)),
                    rewards=dict(zip(keys, part.rewards.tolist())),
                    new_obs=rows_to_map(keys, part.next_obs),
                    terminated=dict(zip(keys, part.terminated.tolist())),
                    truncated=dict(zip(keys, part.truncated.tolist())),
                    new_action_mask=None
                    if part.next_action_mask is None
                    else dict(zip(keys, part.next_action_mask)),
                )
            )
        return None

    def do_policy_copy(self, weights: bool) -> PolicyDescription:
        """A copy of the policy to act with elsewhere (`local_inference` agents); with the
        weights when `weights`."""
        raise NotImplementedError(f"{type(self).__name__} offers no local inference")

    def do_episode_stopped(self) -> None:
        """The episode is over."""

    def do_reset(self, unload_model: bool) -> None:
        """Back to the initial state; drop the model when `unload_model`."""

    def do_terminate(self) -> None:
        """Release resources; the service answers only status afterwards."""


__getattr__ = renamed(__name__, {"PolicyCopy": "PolicyDescription"}, globals())  # 0.1's name
