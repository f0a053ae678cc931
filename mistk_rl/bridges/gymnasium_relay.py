"""The agent side of the gymnasium bridge: an agent whose every action request waits for a
gymnasium caller (RLlib's ExternalEnv, turned onto the contract).

The orchestrator drives its agent: it sends the outcomes of the last actions and asks for
the next ones (stepColumns, or the entity form's step). `RelayAgent` takes both to a
`Handoff`, and the service's step thread waits there until the caller answers with
`Handoff.answer`. The caller sees each request as an `Ask`: the env copies that must act,
their observations and action masks, and what the previous actions led to (`Outcome`, by
copy); once the orchestrator ends the episode run (episodeStopped, a reset) it sees `Ended`,
with the outcomes no later request carried.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.files import atomic_write_json
from mistk_rl.framework.agent import AbstractAgent, Acted, Acting, EpisodeInfo, Transitions
from mistk_rl.wire.columns import Columns


class BridgeError(RuntimeError):
    """The gymnasium bridge cannot go on; the message says which side did what."""


@dataclass
class Outcome:
    """What one env copy's last action led to."""

    obs: Any  # the next observation: the episode's final one when it ended
    reward: float
    terminated: bool
    truncated: bool
    action_mask: Optional[np.ndarray] = None  # the legal actions in `obs`


@dataclass
class Ask:
    """One action request: row i is env copy ``copies[i]``, to act on ``obs[i]``; the
    outcomes of earlier actions came with it."""

    copies: list[int]
    obs: list[Any]
    masks: Optional[list[np.ndarray]]
    outcomes: dict[int, Outcome] = field(default_factory=dict)


@dataclass
class Ended:
    """The orchestrator ended the episode run; no request follows until the next one."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)


News = Union[Ask, Ended]
Fallback = Callable[[int, Optional[list[np.ndarray]]], np.ndarray]


def copy_index(name: str) -> int:
    """The env copy an entity name is about: ``player:3`` (a gym copy) and ``player_1:3``
    (a game seat in copy 3) are copy 3; a bare ``player`` (a single copy) is copy 0."""
    _, _, suffix = name.rpartition(":")
    return int(suffix) if suffix.isdigit() else 0


def _copies(envs: np.ndarray, names: Optional[list[str]]) -> list[int]:
    return [int(e) for e in envs] if names is None else [copy_index(n) for n in names]


def _row(columns: Columns, i: int) -> Any:
    """Row i as arrays of its own (a request's columns may be views into its body)."""
    if isinstance(columns, dict):
        return {key: np.array(column[i]) for key, column in columns.items()}
    return np.array(columns[i])


class Handoff:
    """Where the service's step thread and the gymnasium caller meet (module doc). Every
    wait is bounded: the step thread's by `answer_timeout`, the caller's by its own."""

    def __init__(self, answer_timeout: float) -> None:
        self.answer_timeout = answer_timeout
        self._cond = threading.Condition()
        self._outcomes: dict[int, Outcome] = {}  # arrived, not yet handed over
        self._news: Optional[News] = None  # for the caller, not taken yet
        self._waiting = False  # the step thread waits for an answer
        self._answer: Optional[np.ndarray] = None
        self._draining = False  # answer at once with `fallback` (the run is being stopped)

    # ---- the service's side ------------------------------------------------------------
    def learned(self, outcomes: dict[int, Outcome]) -> None:
        with self._cond:
            self._outcomes.update(outcomes)

    def ask(
        self,
        copies: list[int],
        obs: list[Any],
        masks: Optional[list[np.ndarray]],
        fallback: Fallback,
    ) -> np.ndarray:
        """The caller's actions for these rows; `fallback`'s while the run is being stopped
        (so the orchestrator gets to see its stop). TimeoutError when no answer comes."""
        with self._cond:
            ask = Ask(copies, obs, masks, self._outcomes)
            self._outcomes = {}
            if self._draining:
                return fallback(len(copies), masks)
            self._news, self._waiting, self._answer = ask, True, None
            self._cond.notify_all()
            try:
                if not self._cond.wait_for(
                    lambda: self._answer is not None or self._draining, self.answer_timeout
                ):
                    self._news = None
                    raise TimeoutError(
                        f"the gymnasium caller did not answer an action request within "
                        f"{self.answer_timeout} s (answer_timeout)"
                    )
                answer = self._answer
                return fallback(len(copies), masks) if answer is None else answer
            finally:
                self._waiting, self._answer = False, None

    def ended(self) -> None:
        """The run is over (episodeStopped, reset, terminate): the caller sees `Ended`."""
        with self._cond:
            self._news = Ended(self._outcomes)
            self._outcomes = {}
            self._cond.notify_all()

    # ---- the caller's side -------------------------------------------------------------
    def take(self, timeout: float) -> Optional[News]:
        """The next news, or None when none came within `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._news is not None, timeout):
                return None
            news, self._news = self._news, None
            return news

    def answer(self, actions: np.ndarray) -> None:
        """Answer the request the step thread waits on."""
        with self._cond:
            if not self._waiting:
                raise BridgeError(
                    "no action request is waiting for this answer: the orchestrator's "
                    f"request was given up (the caller took over answer_timeout="
                    f"{self.answer_timeout} s, or the orchestrator went away)"
                )
            self._answer = actions
            self._cond.notify_all()

    def drain(self, on: bool = True) -> None:
        """From now on answer every request at once with the fallback (`on`), or no longer."""
        with self._cond:
            self._draining = on
            self._cond.notify_all()

    def clear(self) -> None:
        """Forget what an ended run left (before the next run starts)."""
        with self._cond:
            self._news, self._outcomes = None, {}


def sample_actions(space: spaces.Space, rows: int, masks: Optional[list[np.ndarray]]) -> np.ndarray:
    """Actions of the space, legal under each row's mask: what a run being stopped is
    answered with (they are never taken by anyone who learns from them)."""
    if masks is not None and isinstance(space, spaces.Discrete):
        return np.asarray([space.sample(mask=np.asarray(m, np.int8).reshape(-1)) for m in masks])
    return np.asarray([space.sample() for _ in range(rows)])


class RelayAgent(AbstractAgent):
    """The agent a `Handoff` stands behind (module doc). It learns nothing: the caller
    does. Its steps wait for the caller, so they run off the service's event loop."""

    steps_inline = False

    def __init__(self, handoff: Handoff) -> None:
        super().__init__()
        self.handoff = handoff

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
        if observation_space is None or action_space is None:
            raise InvalidRequest(
                "the gymnasium bridge needs an observationSpace and an actionSpace at "
                "registration: they are the gymnasium env's spaces"
            )

    def do_episode_started(self, episode: EpisodeInfo) -> None:
        """(The first observations come again in the first action request.)"""

    def do_learn(self, transitions: Transitions) -> None:
        copies = _copies(transitions.envs, transitions.names)
        mask = transitions.next_action_mask
        self.handoff.learned(
            {
                copy: Outcome(
                    _row(transitions.next_obs, i),
                    float(transitions.rewards[i]),
                    bool(transitions.terminated[i]),
                    bool(transitions.truncated[i]),
                    None if mask is None else np.array(mask[i]),
                )
                for i, copy in enumerate(copies)
            }
        )

    def do_act(self, batch: Acting) -> Acted:
        rows = range(len(batch))
        masks = None if batch.action_mask is None else [np.array(m) for m in batch.action_mask]
        actions = self.handoff.ask(
            _copies(batch.envs, batch.names),
            [_row(batch.obs, i) for i in rows],
            masks,
            self._fallback,
        )
        return Acted(np.asarray(actions))

    def _fallback(self, rows: int, masks: Optional[Sequence[np.ndarray]]) -> np.ndarray:
        assert self.action_space is not None  # (registered: `validate_registration`)
        return sample_actions(self.action_space, rows, None if masks is None else list(masks))

    def do_episode_stopped(self) -> None:
        self.handoff.ended()

    def do_reset(self, unload_model: bool) -> None:
        self.handoff.ended()

    def do_terminate(self) -> None:
        self.handoff.ended()

    def do_save_model(self, path: Path) -> None:
        atomic_write_json(path, {"agent": "RelayAgent", "note": "the gymnasium caller learns"})
