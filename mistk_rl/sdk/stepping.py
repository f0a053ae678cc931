"""An orchestrator's side of the step path with one agent: env copies in, actions out.

An orchestrator's loop knows, per env copy, what its last step led to (an `StepOutcome`) and
which copies must act now (their observations). A stepper turns that into requests:

- `ColumnStepper` (the agent lists the ``columns`` capability): one stepColumns request, an
  array per field. It remembers the step id of each copy's action in flight and reports the
  outcome under it, so each observation crosses once and no action is sent back. With
  ``depth`` 2 it keeps two requests in flight, for two halves of the copies, so the env
  steps one half while the agent answers for the other.
- `EntityStepper` (any other agent, e.g. one written against MISTK's API): the entity-keyed
  step (or replayAction then getAction), each copy an entity ``name:i`` (``name`` alone for
  one copy), the transitions sent whole.

- `LocalStepper` (local inference, opt-in per agent; capability ``local``): acts with a copy
  of the agent's policy in this process (`getPolicy`), keeps each step's transition and
  sends them every `batch_steps` env steps in one replayColumns request, whose answer
  brings new weights once the agent has made `sync_every` updates since the copy's. The
  agent service still owns learning, checkpoints and the lifecycle; the copy explores as
  the agent would (`mistk_rl.rl.actor.Actor`: the epsilon at the env step, sampling, the
  warm-up, masks), with weights at most `sync_every` updates and one batch old.

All answer ``env -> action`` for copies that act (a pipelined `ColumnStepper` answers
some of the ready copies, the others' actions being on their way), so the loop does not
care which: it steps the copies it got actions for.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

import numpy as np

from mistk_rl._moved import renamed
from mistk_rl.sdk.client import AgentClient
from mistk_rl.spaces import space_from_dict
from mistk_rl.wire.columns import concat_rows, take_rows
from mistk_rl.wire.step_columns import step_body

Masks = Optional[Mapping[int, Any]]


@dataclass
class StepOutcome:
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
    def step(
        self, ready: Mapping[int, Any], outcomes: Mapping[int, StepOutcome], masks: Masks = None
    ) -> dict[int, Any]:
        """Report `outcomes` (env -> what its action in flight led to) and answer actions
        for `ready` copies (env -> the observation it acts on; `masks`: its legal actions):
        all of them, or some while the others' are on their way (a pipelined
        `ColumnStepper`). A copy in both whose outcome is not done acts on the outcome's
        obs. With nothing ready (the loop's end) it only reports."""

    def in_flight(self) -> set[int]:
        """The env copies whose action's outcome is not reported yet."""


@dataclass(frozen=True)
class LocalInference:
    """How an agent's policy copy is used (`LocalStepper`)."""

    sync_every: int = 1  # take new weights once the agent made this many updates
    batch_steps: int = 64  # send the experience every this many env steps


def stepper_for(
    client: AgentClient,
    capabilities: frozenset[str],
    name: str,
    num_envs: int,
    local: Optional[LocalInference] = None,
    *,
    mode: str = "collect",
    learn: bool = True,
    epsilon: Optional[float] = None,
    depth: int = 1,
) -> Stepper:
    """The stepper for this agent: local inference when asked for (the agent must list
    ``local``), else the columnar step (with `depth` requests in flight), else the entity
    form."""
    if local is not None:
        return LocalStepper(client, local, mode=mode, learn=learn, epsilon=epsilon)
    if "columns" in capabilities:
        return ColumnStepper(client, depth, stream="stream" in capabilities)
    return EntityStepper(client, capabilities, name, num_envs)


class ColumnStepper:
    """stepColumns (module doc), with up to `depth` requests in flight.

    With ``depth`` 1 each call sends one request and waits for its answer. With ``depth``
    d > 1 the copies are split into d groups the first time; each later call sends the
    copies that are ready again as one request and takes the answer of the oldest request
    in flight (`mistk_rl.sdk.client.ColumnPipeline`). Its caller steps that group's copies while
    the agent computes the next group's actions: env stepping and the agent's work overlap
    instead of taking turns, and the round trip's wait is hidden. A copy acts on its own
    observations either way; what changes is that a group's actions come from the policy
    as it stood when its request arrived. The agent runs the requests in the order sent, so
    a seeded run is reproducible at any depth (and differs from depth 1).

    With `stream` (the agent lists ``stream``) the requests go as frames on the agent's step
    stream (`mistk_rl.wire.frames`), at any depth: the same bodies and answers without HTTP per
    step. The stream closes when a loop ends (a call with no ready copies).
    """

    def __init__(self, client: AgentClient, depth: int = 1, stream: bool = False) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, not {depth}")
        self.client = client
        self.depth = depth
        self.step_ids: dict[int, int] = {}  # env -> the step id of its action in flight
        self._pipeline = client.column_pipeline(stream) if depth > 1 or stream else None
        self._waiting: deque[list[int]] = deque()  # per request in flight: its acting copies
        self._asked: set[int] = set()  # the copies in those requests
        self._held: dict[int, Any] = {}  # actions answered but not yet taken by the caller

    def in_flight(self) -> set[int]:
        return set(self.step_ids) | self._asked

    def step(
        self, ready: Mapping[int, Any], outcomes: Mapping[int, StepOutcome], masks: Masks = None
    ) -> dict[int, Any]:
        if self.depth == 1:  # one request at a time, over HTTP or the stream
            if not ready and not outcomes:
                if self._pipeline is not None:  # (the loop ends: so does the stream)
                    self._pipeline.close()
                return {}
            acting, body = self._body(ready, outcomes, masks)
            if self._pipeline is None:
                return self._took(acting, self.client.post_step(body))
            self._pipeline.send_body(body)
            answer = self._pipeline.receive()
            if not ready:  # (the loop ends: so does the stream)
                self._pipeline.close()
            return self._took(acting, answer)
        pipeline = self._pipeline
        assert pipeline is not None  # (there at any depth > 1)
        waiting = self._asked.union(self._held) if self._held else self._asked
        asking = {i: obs for i, obs in ready.items() if i not in waiting}
        groups = (
            _split(asking, outcomes, self.depth)
            if not self._waiting and not self._held
            else [(asking, outcomes)]
        )
        for group, reported in groups:
            if group or reported:
                acting, body = self._body(group, reported, masks)
                pipeline.send_body(body)
                self._waiting.append(acting)
                self._asked.update(acting)
        if not ready:  # the loop ends: read every answer, keep the actions for a next call
            while self._waiting:
                self._held.update(self._receive())
            pipeline.close()
            return {}
        held = {i: self._held.pop(i) for i in ready if i in self._held}
        if held or not self._waiting:
            return held
        return self._receive()

    def _receive(self) -> dict[int, Any]:
        """The oldest request's answer: env -> action."""
        acting = self._waiting.popleft()
        self._asked.difference_update(acting)
        return self._took(acting, self._pipeline.receive())  # type: ignore[union-attr]

    def _body(
        self, ready: Mapping[int, Any], outcomes: Mapping[int, StepOutcome], masks: Masks
    ) -> tuple[list[int], dict[str, Any]]:
        """The copies that act and the stepColumns body of one request
        (`mistk_rl.wire.step_columns.step_body`)."""
        rows = list(outcomes) + [i for i in ready if i not in outcomes]
        n, reported = len(rows), len(outcomes)
        obs = [o.obs for o in outcomes.values()] + [ready[i] for i in rows[reported:]]
        acts = np.fromiter((i in ready for i in rows), bool, n)
        reset = [(r, i) for r, (i, o) in enumerate(outcomes.items()) if o.done and i in ready]
        columns: dict[str, Any] = {"envs": np.asarray(rows, np.int64), "obs": _stack(obs)}
        if outcomes:
            ids = np.full(n, -1, np.int64)
            ids[:reported] = [self.step_ids.pop(i) for i in outcomes]
            rewards = np.zeros(n, np.float32)
            rewards[:reported] = [o.reward for o in outcomes.values()]
            terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
            terminated[:reported] = [o.terminated for o in outcomes.values()]
            truncated[:reported] = [o.truncated for o in outcomes.values()]
            columns.update(
                step_ids=ids, rewards=rewards, terminated=terminated, truncated=truncated
            )
        mask_rows = [o.action_mask for o in outcomes.values()] + [
            (masks or {}).get(i) for i in rows[reported:]
        ]
        if any(m is not None for m in mask_rows) or masks:
            columns["action_mask"] = _mask_column(mask_rows, masks)
        if reset:
            columns["reset"] = {
                "rows": np.asarray([r for r, _ in reset], np.int64),
                "obs": _stack([ready[i] for _, i in reset]),
            }
            if "action_mask" in columns:
                columns["reset"]["actionMask"] = _mask_column(
                    [(masks or {}).get(i) for _, i in reset], masks
                )
        if not acts.all():
            columns["act"] = acts
        return [i for i in rows if i in ready], step_body(**columns)

    def _took(self, acting: list[int], answer: Any) -> dict[int, Any]:
        """Record the step ids of an answer's actions; env -> action."""
        self.step_ids.update(zip(acting, answer.step_ids.tolist()))
        return dict(zip(acting, answer.actions))


def _split(
    ready: Mapping[int, Any], outcomes: Mapping[int, StepOutcome], depth: int
) -> list[tuple[dict[int, Any], dict[int, StepOutcome]]]:
    """Up to `depth` groups of the ready copies, each with its copies' outcomes (outcomes of
    copies that do not act again go with the first group)."""
    envs = list(ready)
    size = -(-len(envs) // depth) if envs else 1
    groups = [envs[k : k + size] for k in range(0, len(envs), size)] or [[]]
    out = []
    for k, group in enumerate(groups):
        members = set(group)
        out.append(
            (
                {i: ready[i] for i in group},
                {i: o for i, o in outcomes.items() if i in members or (k == 0 and i not in ready)},
            )
        )
    return out


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
        assert masks is not None  # (a mask column is built only where masks came)
        known = next(iter(masks.values()))
    width = np.asarray(known).reshape(-1).shape[0]
    return np.stack(
        [np.ones(width, bool) if m is None else np.asarray(m, bool).reshape(-1) for m in rows]
    )


class EntityStepper:
    """The entity-keyed step path (module doc)."""

    def __init__(
        self, client: AgentClient, capabilities: frozenset[str], name: str, num_envs: int
    ) -> None:
        self.client = client
        self.capabilities = capabilities
        self.name = name
        self.one = num_envs == 1
        self.sent: dict[int, tuple[Any, Any]] = {}  # env -> (obs, action) of its step in flight

    def in_flight(self) -> set[int]:
        return set(self.sent)

    def entity(self, i: int) -> str:
        return self.name if self.one else f"{self.name}:{i}"

    def step(
        self, ready: Mapping[int, Any], outcomes: Mapping[int, StepOutcome], masks: Masks = None
    ) -> dict[int, Any]:
        replay = {self.entity(i): self._transition(i, o) for i, o in outcomes.items()}
        if not ready:
            if replay:
                self.client.replay_action(replay_batch(replay))
            return {}
        obs = {self.entity(i): o for i, o in ready.items()}
        mask = {self.entity(i): m for i, m in masks.items()} if masks else None
        if "step" in self.capabilities:
            answer = self.client.step(
                obs, replay=replay_batch(replay) if replay else None, action_mask=mask
            )
        else:
            if replay:
                self.client.replay_action(replay_batch(replay))
            answer = self.client.get_action(obs, mask)
        actions = {i: answer[self.entity(i)] for i in ready}
        self.sent.update((i, (ready[i], actions[i])) for i in ready)
        return actions

    def _transition(self, i: int, outcome: StepOutcome) -> dict:
        obs, action = self.sent.pop(i)
        entry = {
            "prevObs": obs,
            "actions": action,
            "rewards": float(outcome.reward),
            "newObs": outcome.obs,
            "terminated": bool(outcome.terminated),
            "truncated": bool(outcome.truncated),
        }
        if outcome.action_mask is not None:
            entry["newActionMask"] = np.asarray(outcome.action_mask)
        return entry


REPLAY_FIELDS = ("prevObs", "actions", "rewards", "newObs", "terminated", "truncated")


def replay_batch(replay: dict[str, dict]) -> dict[str, dict]:
    """Per-entity transitions -> the spec's Replay (one map per field); the next masks only
    when every entity has one."""
    fields = REPLAY_FIELDS + (
        ("newActionMask",) if all("newActionMask" in t for t in replay.values()) else ()
    )
    return {f: {entity: t[f] for entity, t in replay.items()} for f in fields}


def prepare_local_inference() -> None:
    """Load what a policy copy needs (torch, the policies) now: a process that will run
    one calls this in its set-up, so that its first episode does not pay for it (about 1.2 s
    on these machines)."""
    import mistk_rl.rl.actor  # noqa: F401


class LocalStepper:
    """Local inference (module doc)."""

    def __init__(
        self,
        client: AgentClient,
        settings: LocalInference = LocalInference(),
        *,
        mode: str = "collect",
        learn: bool = True,
        epsilon: Optional[float] = None,
    ) -> None:
        # (imported here: torch loads only in processes that run a copy, not in every
        # orchestrator and SDK caller)
        from mistk_rl.rl.actor import Actor, load_weights, policy_class
        from mistk_rl.rl.policies.random import RandomPolicy

        self._load_weights = load_weights
        self.client, self.settings, self.mode, self.learn = client, settings, mode, learn
        copy = client.get_policy(weights=True)
        obs_space = space_from_dict(
            copy.observation_space.model_dump(by_alias=True, exclude_none=True)
        )
        act_space = space_from_dict(copy.action_space.model_dump(by_alias=True, exclude_none=True))
        # the copy draws its own random numbers: seeded from the agent's seed and where its
        # learning stands, so two copies of one run do not repeat each other's draws
        seed = (
            None
            if copy.seed is None
            else int(np.random.SeedSequence([copy.seed, copy.env_steps]).generate_state(1)[0])
        )
        # on the CPU whatever the agent's device: the weights come as CPU arrays, and the
        # env next to the copy hands over one small batch at a time
        self.policy = policy_class(copy.policy)(
            copy.config, obs_space, act_space, seed=seed, device="cpu", learns=False
        )
        assert copy.weights is not None  # (asked for)
        self._load_weights(self.policy, copy.weights)
        self.policy.epsilon_override = epsilon
        (self.policy.eval_mode if mode == "eval" else self.policy.collect_mode).reset()
        warmup = (
            RandomPolicy(None, obs_space, act_space, seed=seed)
            if copy.warmup_until > copy.env_steps
            else None
        )
        self.actor = Actor(self.policy, warmup)
        self.warmup_until, self.version = copy.warmup_until, copy.version
        self.env_steps = copy.env_steps  # the agent's, plus the steps not yet sent
        self.sent: dict[int, tuple[_Acted, int]] = {}  # env -> its action's batch and row
        self.rows: list[tuple[int, _Acted, int, StepOutcome]] = []  # transitions not yet sent
        self.sends = 0  # replayColumns requests made
        self._batches = 0  # batches acted on so far (their order: a copy's steps in time)

    def in_flight(self) -> set[int]:
        return set(self.sent)

    def step(
        self, ready: Mapping[int, Any], outcomes: Mapping[int, StepOutcome], masks: Masks = None
    ) -> dict[int, Any]:
        for i, outcome in outcomes.items():
            batch, row = self.sent.pop(i)
            if self.learn:
                self.rows.append((i, batch, row, outcome))
        if self.rows and (len(self.rows) >= self.settings.batch_steps or not ready):
            self.flush()
        if not ready:
            return {}
        envs = list(ready)
        mask = None if not masks else _mask_column([masks.get(i) for i in envs], masks)
        obs = _stack([ready[i] for i in envs])
        actions, extras = self.actor.act(
            obs,
            mask,
            mode=self.mode,
            env_steps=self.env_steps + len(self.rows),
            warming_up=self.env_steps + len(self.rows) < self.warmup_until,
        )
        batch = _Acted(self._batches, obs, actions, extras)
        self._batches += 1
        self.sent.update((i, (batch, row)) for row, i in enumerate(envs))
        return dict(zip(envs, actions))

    def flush(self) -> None:
        """Send the transitions kept so far (one replayColumns request), a batch's rows
        taken together (batches in the order they acted: each copy's steps in time order);
        take the weights the answer brings."""
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        groups: dict[int, list[int]] = {}  # batch -> the positions of its rows
        for pos, (_, batch, _, _) in enumerate(rows):
            groups.setdefault(batch.seq, []).append(pos)
        order = [pos for seq in sorted(groups) for pos in groups[seq]]
        taken = [
            rows[group[0]][1].take([rows[pos][2] for pos in group])
            for group in (groups[seq] for seq in sorted(groups))
        ]
        outcomes = [rows[pos][3] for pos in order]
        next_masks = [o.action_mask for o in outcomes]
        answer = self.client.replay_columns(
            np.asarray([rows[pos][0] for pos in order], np.int64),
            concat_rows([t.obs for t in taken]),
            np.concatenate([t.actions for t in taken]),
            np.asarray([o.reward for o in outcomes], np.float32),
            _stack([o.obs for o in outcomes]),
            np.asarray([o.terminated for o in outcomes]),
            np.asarray([o.truncated for o in outcomes]),
            extras={k: np.concatenate([t.extras[k] for t in taken]) for k in taken[0].extras},
            next_action_mask=(
                None if all(m is None for m in next_masks) else _mask_column(next_masks, None)
            ),
            weights_version=self.version,
            sync_every=self.settings.sync_every,
        )
        self.sends += 1
        self.env_steps = answer.env_steps
        if answer.weights is not None:
            self._load_weights(self.policy, answer.weights)
            self.version = answer.version


@dataclass
class _Acted:
    """One batch the copy acted on: its rows' observations, actions and extras."""

    seq: int
    obs: Any  # an array [N, ...], or a dict of them
    actions: np.ndarray
    extras: dict[str, np.ndarray]

    def take(self, rows: list[int]) -> "_Acted":
        index = np.asarray(rows)
        return _Acted(
            self.seq,
            take_rows(self.obs, index),
            self.actions[index],
            {name: extra[index] for name, extra in self.extras.items()},
        )


__getattr__ = renamed(__name__, {"Outcome": "StepOutcome"}, globals())  # 0.1's name
