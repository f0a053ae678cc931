"""Transitions as columns, from the service's step to the replay ring: `TransitionBatch` (one
array per key, row i one transition) and `NStepColumns`, n-step returns computed on those
arrays (a loop over the n offsets of a window, none over rows).

`NStepColumns` gives the items a per-row accumulator (tests/rl/nstep_reference.py), one per
entity, would give fed the rows in the order they arrived: the same values (the same float64 sums in
the same order) in the same order (by the arrival of the step that completes a window, then
by the window's start).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mistk_rl.rl.data.returns import check_nstep
from mistk_rl.wire.columns import concat_rows, take_rows


@dataclass
class TransitionBatch:
    """Transitions in columns: key -> array [N, ...] (``obs``/``next_obs`` of a Dict space: a
    dict of such arrays). At least ``reward``; what a transition dict holds otherwise."""

    columns: dict[str, Any]

    def __len__(self) -> int:
        return len(self.columns["reward"])

    def __getitem__(self, rows: Any) -> TransitionBatch:
        """These rows (an index array or a slice), as a batch."""
        return TransitionBatch({key: take_rows(value, rows) for key, value in self.columns.items()})

    def with_columns(self, **columns: Any) -> TransitionBatch:
        return TransitionBatch({**self.columns, **columns})

    def rows(self) -> list[dict]:
        """One transition dict per row (where a consumer takes dicts: a game's symmetries,
        object storage, a checkpoint's n-step windows)."""
        return [
            {key: take_rows(value, i) for key, value in self.columns.items()}
            for i in range(len(self))
        ]

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]]) -> TransitionBatch:
        """Transition dicts (one key set) stacked into columns."""
        return cls({key: _stack([row[key] for row in rows]) for key in rows[0]})

    @classmethod
    def concat(cls, parts: Sequence[TransitionBatch]) -> TransitionBatch:
        """Batches of one layout, one after the other."""
        if len(parts) == 1:
            return parts[0]
        return cls({key: concat_rows([p.columns[key] for p in parts]) for key in parts[0].columns})


def _stack(values: list) -> Any:
    if isinstance(values[0], Mapping):
        return {key: np.asarray([v[key] for v in values]) for key in values[0]}
    return np.asarray(values)


class NStepColumns:
    """n-step transitions of many entities' streams, a batch of steps at a time.

    Item t: reward = sum_{k<m} gamma^k r_{t+k} with m = min(n, steps to the episode's end,
    inclusive, or to the stream's cut); next_obs, terminated, truncated and next_action_mask
    of step t+m-1; gamma_n = gamma**m. Other keys are copied from step t. Steps whose window is
    not complete yet wait for the entity's next steps (`pending`), or for `flush`.
    """

    def __init__(self, n: int, gamma: float) -> None:
        check_nstep(n, gamma)
        self.n, self.gamma = n, gamma
        self._powers = np.array([gamma**k for k in range(n + 1)])  # (Python's pow, as before)
        self._pending: Optional[TransitionBatch] = None
        self._keys: list[Any] = []  # the entity of each pending row
        self._entities: dict[Any, None] = {}  # every entity seen, in first-seen order

    def __len__(self) -> int:
        return len(self._keys)

    def push(self, keys: Sequence[Any], batch: TransitionBatch) -> Optional[TransitionBatch]:
        """Steps in arrival order (an entity's in time order), `keys` their entities: the items
        they complete, in the order they complete; None when none does."""
        self._entities.update(dict.fromkeys(keys))
        if self.n == 1:  # every step is an item at once: no window to keep
            every = np.arange(len(batch))
            reward = np.asarray(batch.columns["reward"], np.float64)
            return self._items(batch, every, every, reward, np.ones(len(batch), np.int64))
        rows = batch if self._pending is None else TransitionBatch.concat([self._pending, batch])
        return self._complete(rows, [*self._keys, *keys], cut=False)

    def flush(self, entities: Optional[Iterable[Any]] = None) -> Optional[TransitionBatch]:
        """Emit the pending items of `entities` (all when None), windows ending at each one's
        last pending step, entity by entity in first-seen order; they start afresh."""
        if self._pending is None:
            return None
        wanted = set(self._entities if entities is None else entities)
        out = np.fromiter((k in wanted for k in self._keys), bool, len(self._keys))
        if not out.any():
            return None
        kept = np.flatnonzero(~out)
        cut = self._pending[np.flatnonzero(out)]
        cut_keys = [self._keys[i] for i in np.flatnonzero(out)]
        self._set_pending(self._pending[kept], [self._keys[i] for i in kept])
        return self._complete(cut, cut_keys, cut=True, keep_pending=True)

    def clear(self) -> None:
        """Forget the pending steps and the entities seen."""
        self._set_pending(None, [])
        self._entities.clear()

    def pending(self) -> dict[Any, list[dict]]:
        """The steps whose items are not complete yet, per entity (oldest first), entities
        in first-seen order."""
        rows: dict[Any, list[dict]] = {}
        if self._pending is not None:
            for key, row in zip(self._keys, self._pending.rows()):
                rows.setdefault(key, []).append(row)
        return {key: rows[key] for key in self._entities if key in rows}

    def _set_pending(self, rows: Optional[TransitionBatch], keys: list[Any]) -> None:
        self._pending, self._keys = (rows, keys) if keys else (None, [])

    def _complete(
        self, rows: TransitionBatch, keys: list[Any], cut: bool, keep_pending: bool = False
    ) -> Optional[TransitionBatch]:
        """The items of the windows `rows` complete, in emission order; the rows left become
        the pending ones unless `keep_pending`. A window grows one step of its entity at a
        time and closes at an episode end, at n steps, or (with `cut`) at the entity's last
        step."""
        entity = self._entity_codes(keys, cut)
        order = np.lexsort((np.arange(len(keys)), entity))  # by entity, then arrival
        group = entity[order]
        ends = _ends(rows)[order]
        reward = np.asarray(rows.columns["reward"], np.float64)[order]
        size = len(order)
        last_of_group = np.ones(size, bool)
        last_of_group[:-1] = group[1:] != group[:-1]
        start = np.arange(size)
        growing, closed = np.ones(size, bool), np.zeros(size, bool)
        end, steps, returns = np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size)
        for k in range(self.n):
            at = np.minimum(start + k, size - 1)
            inside = growing & (start + k < size) & (group[at] == group)
            returns[inside] += self._powers[k] * reward[at[inside]]
            closes = inside & (ends[at] | (k == self.n - 1) | (cut & last_of_group[at]))
            end[closes], steps[closes], closed[closes] = at[closes], k + 1, True
            growing = inside & ~closes
        if not keep_pending:
            left = np.sort(order[~closed])
            self._set_pending(rows[left] if len(left) else None, [keys[i] for i in left])
        first, last = order[closed], order[end[closed]]  # in the rows' arrival order
        if not len(first):
            return None
        emitted = np.lexsort((first, entity[first])) if cut else np.lexsort((first, last))
        return self._items(
            rows, first[emitted], last[emitted], returns[closed][emitted], steps[closed][emitted]
        )

    def _entity_codes(self, keys: list[Any], cut: bool) -> np.ndarray:
        """A number per row naming its entity. A step's windows only need rows grouped (one
        sort in numpy, no loop over rows); a cut emits entity by entity, in first-seen
        order, so there the number is that rank."""
        if not cut:
            return np.unique(np.asarray(keys), return_inverse=True)[1].reshape(-1)
        rank = {key: i for i, key in enumerate(self._entities)}
        return np.fromiter((rank[k] for k in keys), np.int64, len(keys))

    def _items(
        self,
        rows: TransitionBatch,
        first: np.ndarray,
        last: np.ndarray,
        returns: np.ndarray,
        steps: np.ndarray,
    ) -> TransitionBatch:
        """The n-step items of the windows first[i]..last[i] (rows in arrival order)."""
        columns = rows.columns
        items = rows[first].with_columns(
            reward=returns,
            next_obs=take_rows(columns["next_obs"], last),
            terminated=np.asarray(columns["terminated"], bool)[last],
            truncated=np.asarray(columns["truncated"], bool)[last],
            gamma_n=self._powers[steps],
        )
        if "next_action_mask" in columns:  # the legal actions belong to the window's end
            items.columns["next_action_mask"] = columns["next_action_mask"][last]
        return items


def _ends(rows: TransitionBatch) -> np.ndarray:
    return np.asarray(rows.columns["terminated"], bool) | np.asarray(
        rows.columns["truncated"], bool
    )
