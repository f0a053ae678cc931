"""`StepStore`: what an agent acted on, kept under step ids until the step's outcome comes.

Every action an agent service answers gets a step id. The service keeps the row it acted on
(the observation, the action, and the agent's extras: log-prob, value, ...) under that id;
the request that reports the step's outcome names the id with the reward, the flags and the
next observation, and the service assembles the transition from both. So an observation
crosses the wire once and no action is sent back (the columnar step, `stepColumns`).

Rows are kept per answered batch, as the arrays the agent returned (no per-row Python): a
lookup of N ids is a few numpy calls whatever N is. The entity-keyed form (getAction, step,
replayAction) keeps its old contract: a replay names entities and sends their actions back;
the store finds each entity's last action by name and uses what the agent said with it only
when the action sent back is the one it chose (`match`).

Memory is bounded: at most `max_batches` batches wait; past that the oldest is dropped, and a
later reference to one of its ids is refused as unknown (400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, overload

import numpy as np

from mistk_rl.errors import InvalidRequest, StepsReset
from mistk_rl.framework.agent import Acted, Acting, ReplayBatch, Transitions
from mistk_rl.wire.codec import range_start
from mistk_rl.wire.columns import Columns, concat_rows, take_rows


@dataclass
class Kept:
    """Rows looked up by step id, in the order asked."""

    obs: Columns
    actions: np.ndarray
    extras: dict[str, np.ndarray]


@dataclass
class _Batch:
    base: int  # the step id of row 0
    obs: Columns
    actions: np.ndarray
    extras: dict[str, np.ndarray]
    waiting: np.ndarray  # [n] bool: no outcome reported yet
    left: int  # rows still waiting


class StepStore:
    def __init__(self, max_batches: int = 64) -> None:
        self.max_batches = max_batches
        self._batches: dict[int, _Batch] = {}  # by base, oldest first
        self._next = 0
        self._reset_at = 0  # the first step id handed out since the last reset
        self._entities: dict[str, int] = {}  # the entity form: entity -> its last step id

    def __len__(self) -> int:
        """Rows waiting for their outcome."""
        return sum(batch.left for batch in self._batches.values())

    def put(self, obs: Columns, acted: Acted, names: Optional[list[str]] = None) -> np.ndarray:
        """Keep a batch the agent acted on (`obs`: copied when it is a view into a request
        body); returns its step ids."""
        n = len(acted.actions)
        base, self._next = self._next, self._next + n
        obs = {k: _owned(v) for k, v in obs.items()} if isinstance(obs, dict) else _owned(obs)
        extras = {k: np.asarray(v) for k, v in acted.extras.items()} if acted.extras else {}
        self._batches[base] = _Batch(
            base, obs, np.asarray(acted.actions), extras, np.ones(n, bool), n
        )
        if len(self._batches) > self.max_batches:  # (one batch in, at most one out)
            del self._batches[next(iter(self._batches))]
        if names is not None:
            self._entities.update(zip(names, range(base, base + n)))
        return np.arange(base, base + n, dtype=np.int64)

    def lookup(self, ids: np.ndarray, field: str = "stepIds") -> Kept:
        """The rows kept under `ids` (changes nothing); InvalidRequest naming the first id
        that is not waiting (never given, answered already, or dropped)."""
        whole = self._whole_batch(ids)
        if whole is not None:
            return Kept(whole.obs, whole.actions, whole.extras)
        batch_of, rows = self._locate(ids)
        bad = batch_of < 0
        if bad.any():
            i = int(np.argmax(bad))
            if 0 <= int(ids[i]) < self._reset_at:
                raise StepsReset(
                    f"{field}[{i}]: step id {int(ids[i])} was handed out before the agent "
                    "was reset: its episode is over (start a new one and step its ids)",
                    field=field,
                )
            raise InvalidRequest(
                f"{field}[{i}]: step id {int(ids[i])} is not one this agent "
                "is waiting on (never answered, reported already, or too "
                "old)",
                field=field,
            )
        return self._gather(batch_of, rows)

    def release(self, ids: np.ndarray) -> None:
        """The outcomes of `ids` are in: forget those rows (a batch once all are)."""
        whole = self._whole_batch(ids)
        if whole is not None:
            del self._batches[whole.base]
            return
        batch_of, rows = self._locate(ids)
        bases = self._bases
        for b in np.unique(batch_of[batch_of >= 0]).tolist():
            batch = self._batches[int(bases[b])]
            mine = rows[batch_of == b]
            batch.left -= int(batch.waiting[mine].sum())
            batch.waiting[mine] = False
            if batch.left <= 0:
                del self._batches[batch.base]

    def end_episode(self) -> None:
        """An agent episode starts or stops: the entity form's replays match actions of the
        same episode only. Steps by id stay: a `resume` run reports the outcomes of actions
        the previous call left in flight."""
        self._entities.clear()

    def clear(self) -> None:
        """Reset: nothing waits any more (ids stay unique: they keep counting, so an id from
        before is told apart: `StepsReset`)."""
        self._reset_at = self._next
        self._batches.clear()
        self._entities.clear()

    # ---- the entity form ---------------------------------------------------------------
    def match(self, names: list[str], actions: np.ndarray) -> tuple[np.ndarray, Optional[Kept]]:
        """The entity form's replay: each entity's last step, if its action is the one sent
        back. Returns (matched [N] bool, kept rows: an unmatched row holds another's; None
        when no entity has a step waiting)."""
        ids = np.fromiter((self._entities.get(name, -1) for name in names), np.int64, len(names))
        batch_of, rows = self._locate(ids)
        found = batch_of >= 0
        matched = found.copy()
        if not found.any():
            return matched, None
        kept = self._gather(
            np.where(found, batch_of, batch_of[found][0]), np.where(found, rows, rows[found][0])
        )
        matched &= _same_actions(kept.actions, actions)
        return matched, kept

    def forget(self, names: list[str]) -> None:
        """The entity form: these entities' last steps are reported."""
        ids = [self._entities.pop(name) for name in names if name in self._entities]
        if ids:
            self.release(np.asarray(ids, np.int64))

    # ---- pieces ------------------------------------------------------------------------
    @property
    def _bases(self) -> np.ndarray:
        return np.fromiter(self._batches, np.int64, len(self._batches))

    def _whole_batch(self, ids: np.ndarray) -> Optional[_Batch]:
        """The batch `ids` are all the rows of, in order, none reported yet: the usual case
        (a sync env manager's copies report the steps of the last answer), served with no
        per-row work. None otherwise."""
        if not len(ids):
            return None
        batch = self._batches.get(int(ids[0]))
        n = len(ids)
        if (
            batch is None
            or batch.left != n
            or len(batch.waiting) != n
            or int(ids[-1]) != batch.base + n - 1
            or (n > 2 and range_start(ids) != batch.base)
        ):
            return None
        return batch

    def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(batch index, row) per id; batch index -1 where the id is not waiting."""
        ids = np.asarray(ids, np.int64)
        bases = self._bases
        if not len(bases):
            return np.full(len(ids), -1), np.zeros(len(ids), np.int64)
        batch_of = np.searchsorted(bases, ids, side="right") - 1
        rows = ids - bases[np.maximum(batch_of, 0)]
        sizes = np.fromiter(
            (len(b.waiting) for b in self._batches.values()), np.int64, len(self._batches)
        )
        ok = (batch_of >= 0) & (rows >= 0) & (rows < sizes[np.maximum(batch_of, 0)])
        if ok.any():
            waiting = np.zeros(len(ids), bool)
            for b in np.unique(batch_of[ok]).tolist():
                mine = ok & (batch_of == b)
                waiting[mine] = self._batches[int(bases[b])].waiting[rows[mine]]
            ok &= waiting
        return np.where(ok, batch_of, -1), rows

    def _gather(self, batch_of: np.ndarray, rows: np.ndarray) -> Kept:
        bases = self._bases
        batches = np.unique(batch_of).tolist()
        if len(batches) == 1:  # the usual case: the rows of the last answer
            batch = self._batches[int(bases[batches[0]])]
            return Kept(
                take_rows(batch.obs, rows),
                batch.actions[rows],
                {k: v[rows] for k, v in batch.extras.items()},
            )
        parts, order = [], []
        for b in batches:
            batch = self._batches[int(bases[b])]
            where = np.flatnonzero(batch_of == b)
            parts.append(
                Kept(
                    take_rows(batch.obs, rows[where]),
                    batch.actions[rows[where]],
                    {k: v[rows[where]] for k, v in batch.extras.items()},
                )
            )
            order.append(where)
        back = np.argsort(np.concatenate(order), kind="stable")
        common = set.intersection(*(set(p.extras) for p in parts))  # (warm-up: fewer)
        return Kept(
            take_rows(concat_rows([p.obs for p in parts]), back),
            np.concatenate([p.actions for p in parts])[back],
            {k: np.concatenate([p.extras[k] for p in parts])[back] for k in common},
        )


def _owned(array: np.ndarray) -> np.ndarray:
    """`array`, copied when it is a view (of a request body, say) that it would keep alive."""
    return array if array.base is None else array.copy()


@overload
def stack_entities(values: dict[str, np.ndarray], names: list[str]) -> np.ndarray: ...
@overload
def stack_entities(values: dict[str, Any], names: list[str]) -> Columns: ...
def stack_entities(values: dict[str, Any], names: list[str]) -> Columns:
    """Entity -> value as columns in the order of `names` (checked against a registered
    space: one shape; without one they may differ, and the rows are objects); arrays
    (actions, masks) as one array of rows."""
    array = getattr(values, "array", None)
    if array is not None and list(values) == names:
        return array
    first = values[names[0]]
    if len(names) == 1 and isinstance(first, np.ndarray):  # one entity (getAction): its row
        return first[np.newaxis]  # as a view (np.stack copies: ~5 us); StepStore copies views
    try:
        if isinstance(first, dict):
            return {key: np.stack([np.asarray(values[n][key]) for n in names]) for key in first}
        return np.stack([np.asarray(values[n]) for n in names])
    except (ValueError, KeyError):  # shapes differ (no space registered to check them):
        rows = np.empty(len(names), object)  # one row per entity, as it came
        rows[:] = [values[n] for n in names]
        return rows


def entity_transitions(replay: ReplayBatch, store: StepStore) -> Transitions:
    """The entity form's replay as rows, with what the agent said when it chose each action
    (kept in `store`) where the action sent back is the one it chose."""
    names = list(replay.actions)
    actions = stack_entities(replay.actions, names)
    matched, kept = store.match(names, actions)
    return Transitions(
        envs=np.arange(len(names)),
        obs=stack_entities(replay.prev_obs, names),
        actions=actions,
        extras={} if kept is None else kept.extras,
        rewards=np.fromiter((replay.rewards[n] for n in names), float, len(names)),
        next_obs=stack_entities(replay.new_obs, names),
        terminated=np.fromiter((bool(replay.terminated[n]) for n in names), bool, len(names)),
        truncated=np.fromiter((bool(replay.truncated[n]) for n in names), bool, len(names)),
        next_action_mask=None
        if replay.new_action_mask is None
        else stack_entities(replay.new_action_mask, names).astype(bool),
        names=names,
        matched=None if matched.all() else matched,
    )


def entity_acting(obs: dict[str, Any], mask: Optional[dict[str, Any]]) -> Acting:
    """The entity form's observations (and masks), checked, as rows named by entity."""
    names = list(obs)
    return Acting(
        np.arange(len(names)),
        stack_entities(obs, names),
        None if mask is None else stack_entities(mask, names).astype(bool),
        names=names,
    )


def _same_actions(kept: np.ndarray, sent: np.ndarray) -> np.ndarray:
    """[N] bool: the action sent back is the one kept (a float action as sent, clipped to
    its bounds, within float32 rounding)."""
    kept = np.asarray(kept).reshape(len(kept), -1)
    try:
        sent = np.asarray(sent).reshape(len(kept), -1)
    except ValueError:  # another shape: not what the agent chose
        return np.zeros(len(kept), bool)
    if kept.dtype.kind in "iub" and sent.dtype.kind in "iub":
        return (kept == sent).all(axis=1)
    close = np.isclose(kept.astype(np.float64), sent.astype(np.float64), rtol=1e-6, atol=1e-6)
    return np.all(close, axis=1)
