"""An orchestrator's side of the step path with one agent: env copies in, actions out.

An orchestrator's loop knows, per env copy, what its last step led to (an `Outcome`) and
which copies must act now (their observations). A stepper turns that into requests:

- `ColumnStepper` (the agent lists the ``columns`` capability): one stepColumns request, an
  array per field. It remembers the step id of each copy's action in flight and reports the
  outcome under it, so each observation crosses once and no action is sent back.
- `EntityStepper` (any other agent, e.g. one written against MISTK's API): the entity-keyed
  step (or replayAction then getAction), each copy an entity ``name:i`` (``name`` alone for
  one copy), the transitions sent whole.

Both answer ``env -> action`` for the copies that act, so the loop does not care which.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

import numpy as np

from mistk_rl.client import AgentClient

Masks = Optional[Mapping[int, Any]]


@dataclass
class Outcome:
    """What one env copy's step led to."""

    obs: Any  # the observation it led to (the final one, when the episode ended)
    reward: float
    terminated: bool
    truncated: bool
    action_mask: Any = None  # the legal actions in `obs`, for envs that give them

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Stepper(Protocol):
    def step(self, ready: Mapping[int, Any], outcomes: Mapping[int, Outcome],
             masks: Masks = None) -> dict[int, Any]:
        """Report `outcomes` (env -> what its action in flight led to) and answer an action
        for each `ready` copy (env -> the observation it acts on; `masks`: its legal
        actions). A copy in both whose outcome is not done acts on the outcome's obs."""

    def in_flight(self) -> set[int]:
        """The env copies whose action's outcome is not reported yet."""


def stepper_for(client: AgentClient, capabilities: frozenset[str], name: str,
                num_envs: int) -> Stepper:
    if "columns" in capabilities:
        return ColumnStepper(client)
    return EntityStepper(client, capabilities, name, num_envs)


class ColumnStepper:
    """stepColumns (module doc)."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.step_ids: dict[int, int] = {}  # env -> the step id of its action in flight

    def in_flight(self) -> set[int]:
        return set(self.step_ids)

    def step(self, ready: Mapping[int, Any], outcomes: Mapping[int, Outcome],
             masks: Masks = None) -> dict[int, Any]:
        if not ready and not outcomes:
            return {}
        rows = list(outcomes) + [i for i in ready if i not in outcomes]
        n, reported = len(rows), len(outcomes)
        obs = [o.obs for o in outcomes.values()] + [ready[i] for i in rows[reported:]]
        acts = np.fromiter((i in ready for i in rows), bool, n)
        reset = [(r, i) for r, (i, o) in enumerate(outcomes.items()) if o.done and i in ready]
        body: dict[str, Any] = {}
        if outcomes:
            ids = np.full(n, -1, np.int64)
            ids[:reported] = [self.step_ids.pop(i) for i in outcomes]
            rewards = np.zeros(n, np.float32)
            rewards[:reported] = [o.reward for o in outcomes.values()]
            terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
            terminated[:reported] = [o.terminated for o in outcomes.values()]
            truncated[:reported] = [o.truncated for o in outcomes.values()]
            body.update(step_ids=ids, rewards=rewards, terminated=terminated,
                        truncated=truncated)
        mask_rows = [o.action_mask for o in outcomes.values()] + [
            (masks or {}).get(i) for i in rows[reported:]]
        if any(m is not None for m in mask_rows) or masks:
            body["action_mask"] = _mask_column(mask_rows, masks)
        if reset:
            body["reset"] = {"rows": np.asarray([r for r, _ in reset], np.int64),
                             "obs": _stack([ready[i] for _, i in reset])}
            if "action_mask" in body:
                body["reset"]["actionMask"] = _mask_column(
                    [(masks or {}).get(i) for _, i in reset], masks)
        if not acts.all():
            body["act"] = acts
        answer = self.client.step_columns(np.asarray(rows, np.int64), _stack(obs), **body)
        acting = [i for i in rows if i in ready]
        self.step_ids.update(zip(acting, answer.step_ids.tolist()))
        return dict(zip(acting, answer.actions))


def _stack(rows: list) -> Any:
    """Observations (arrays, or dicts of arrays) as columns."""
    if isinstance(rows[0], Mapping):
        return {key: np.stack([np.asarray(r[key]) for r in rows]) for key in rows[0]}
    return np.stack([np.asarray(r) for r in rows])


def _mask_column(rows: list, masks: Masks) -> np.ndarray:
    """Masks as a column; a row without one allows every action (an env that gives masks
    but not in every info, e.g. its final one)."""
    known = next((m for m in rows if m is not None), None)
    if known is None:
        known = next(iter(masks.values()))
    width = np.asarray(known).reshape(-1).shape[0]
    return np.stack([np.ones(width, bool) if m is None else np.asarray(m, bool).reshape(-1)
                     for m in rows])


class EntityStepper:
    """The entity-keyed step path (module doc)."""

    def __init__(self, client: AgentClient, capabilities: frozenset[str], name: str,
                 num_envs: int) -> None:
        self.client = client
        self.capabilities = capabilities
        self.name = name
        self.one = num_envs == 1
        self.sent: dict[int, tuple[Any, Any]] = {}  # env -> (obs, action) of its step in flight

    def in_flight(self) -> set[int]:
        return set(self.sent)

    def entity(self, i: int) -> str:
        return self.name if self.one else f"{self.name}:{i}"

    def step(self, ready: Mapping[int, Any], outcomes: Mapping[int, Outcome],
             masks: Masks = None) -> dict[int, Any]:
        replay = {self.entity(i): self._transition(i, o) for i, o in outcomes.items()}
        if not ready:
            if replay:
                self.client.replay_action(replay_batch(replay))
            return {}
        obs = {self.entity(i): o for i, o in ready.items()}
        mask = {self.entity(i): m for i, m in masks.items()} if masks else None
        if "step" in self.capabilities:
            answer = self.client.step(obs, replay=replay_batch(replay) if replay else None,
                                      action_mask=mask)
        else:
            if replay:
                self.client.replay_action(replay_batch(replay))
            answer = self.client.get_action(obs, mask)
        actions = {i: answer[self.entity(i)] for i in ready}
        self.sent.update((i, (ready[i], actions[i])) for i in ready)
        return actions

    def _transition(self, i: int, outcome: Outcome) -> dict:
        obs, action = self.sent.pop(i)
        entry = {"prevObs": obs, "actions": action, "rewards": float(outcome.reward),
                 "newObs": outcome.obs, "terminated": bool(outcome.terminated),
                 "truncated": bool(outcome.truncated)}
        if outcome.action_mask is not None:
            entry["newActionMask"] = np.asarray(outcome.action_mask)
        return entry


REPLAY_FIELDS = ("prevObs", "actions", "rewards", "newObs", "terminated", "truncated")


def replay_batch(replay: dict[str, dict]) -> dict[str, dict]:
    """Per-entity transitions -> the spec's Replay (one map per field); the next masks only
    when every entity has one."""
    fields = REPLAY_FIELDS + (("newActionMask",) if all(
        "newActionMask" in t for t in replay.values()) else ())
    return {f: {entity: t[f] for entity, t in replay.items()} for f in fields}
