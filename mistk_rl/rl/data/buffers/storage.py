"""Ring storage for replay buffers: any objects (`Ring`), or transitions column by column
(`TransitionRing`).

In both, the item with unique id k lives in slot k % size. Ids grow forever (``clear`` keeps
counting), so the slot of an id needs no lookup table and comparing a slot's current id with a
remembered one tells whether the reference is stale.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from mistk_rl.rl.data.transition_batch import TransitionBatch

_NUMERIC_KINDS = "biuf"


class Ring:
    """Fixed-size FIFO storage of arbitrary items; the oldest is overwritten first."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"replay_buffer_size must be >= 1, got {size}")
        self.size = int(size)
        self.items: list[Any] = [None] * self.size
        self.ids = np.full(self.size, -1, dtype=np.int64)
        self.valid = np.zeros(self.size, dtype=bool)  # (write through put / invalidate)
        self._count = 0  # valid slots: counted as they change, not per call (a 1M-slot ring)
        self.next_id = 0

    def put(self, items: Union[list, TransitionBatch]) -> np.ndarray:
        """Store items at the tail and return their slots.

        Only the newest ``size`` items are kept when more are given (the rest would be
        overwritten at once); the returned slots line up with ``items[-len(slots):]``.
        """
        items = items[-self.size :]
        if not items:
            return np.empty(0, dtype=np.int64)
        ids = np.arange(self.next_id, self.next_id + len(items), dtype=np.int64)
        slots = ids % self.size
        self._store(slots, items)
        self.ids[slots] = ids
        self._count += len(slots) - int(np.count_nonzero(self.valid[slots]))
        self.valid[slots] = True
        self.next_id += len(items)
        return slots

    def row(self, slot: int) -> Any:
        """The item in `slot`."""
        return self.items[slot]

    def columns(self, slots: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        """The items in `slots` as one array per key, or None: this ring stores objects."""
        return None

    def slots_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of ``ids`` and a mask of those that still hold that id and valid data."""
        ids = np.asarray(ids, dtype=np.int64)
        slots = ids % self.size
        return slots, (self.ids[slots] == ids) & self.valid[slots]

    def invalidate(self, slots: np.ndarray) -> None:
        """Mark the items in `slots` gone (a buffer's removal by use or staleness)."""
        self._count -= int(np.count_nonzero(self.valid[np.unique(slots)]))
        self.valid[slots] = False

    def count(self) -> int:
        return self._count

    def clear(self) -> None:
        self.items = [None] * self.size
        self.ids.fill(-1)
        self.valid.fill(False)
        self._count = 0

    def state_dict(self) -> dict:
        return {
            "items": list(self.items),
            "ids": self.ids.copy(),
            "valid": self.valid.copy(),
            "next_id": self.next_id,
        }

    def load_state_dict(self, state: dict) -> None:
        if len(state["items"]) != self.size:
            raise ValueError(
                f"state holds {len(state['items'])} slots, this buffer has "
                f"replay_buffer_size {self.size}"
            )
        self.items = list(state["items"])
        self.ids = np.array(state["ids"], dtype=np.int64)
        self.valid = np.array(state["valid"], dtype=bool)
        self._count = int(np.count_nonzero(self.valid))
        self.next_id = int(state["next_id"])

    def _store(self, slots: np.ndarray, items: Union[list, TransitionBatch]) -> None:
        if isinstance(items, TransitionBatch):  # (object storage takes dicts)
            items = items.rows()
        for slot, item in zip(slots.tolist(), items):
            self.items[slot] = item


class TransitionRing(Ring):
    """A `Ring` that keeps transition dicts (numbers and fixed-shape numeric arrays) as one
    numpy array per key, as Stable-Baselines3 does: sampling a batch is then one index per
    key instead of a dict per item and a stack per key (most of a small learner's update).
    A value that is itself a dict of arrays (a Dict space's observation) gets one array per
    its key, each of its own dtype (SB3's DictReplayBuffer), and comes back as a dict.

    The layout (keys, per-item shapes) is taken from the first push; dtypes widen as needed
    (an int reward column becomes float when a float arrives), never narrow. Items that do not
    fit (deeper nesting or non-numeric values, other keys or shapes) switch the ring to object
    storage until ``clear``: slower, never wrong.
    """

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._columns: Optional[dict[Column, np.ndarray]] = None
        self._objects = False

    def row(self, slot: int) -> Any:
        if self._columns is None:
            return self.items[slot]
        return _nested(
            {
                key: column[slot].copy() if column.ndim > 1 else column[slot]
                for key, column in self._columns.items()
            }
        )

    def columns(self, slots: np.ndarray) -> Optional[dict[str, Any]]:
        if self._columns is None:
            return None
        return _nested({key: column[slots] for key, column in self._columns.items()})

    def clear(self) -> None:
        super().clear()
        self._columns, self._objects = None, False

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["columns"] = (
            None
            if self._columns is None
            else {key: column.copy() for key, column in self._columns.items()}
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        columns = state.get("columns")
        if columns is not None and any(len(c) != self.size for c in columns.values()):
            raise ValueError(f"state columns do not hold replay_buffer_size {self.size} slots")
        self._columns = None if columns is None else {k: np.array(c) for k, c in columns.items()}
        self._objects = self._columns is None and any(i is not None for i in self.items)

    def _store(self, slots: np.ndarray, items: Union[list, TransitionBatch]) -> None:
        if isinstance(items, TransitionBatch):
            values = None if self._objects else _flat_columns(items.columns)
        else:
            values = None if self._objects else _as_columns(items)
        if not self._objects:
            if values is not None:
                columns = self._columns
                if columns is None:
                    columns = self._columns = {
                        key: np.zeros((self.size, *v.shape[1:]), dtype=v.dtype)
                        for key, v in values.items()
                    }
                if _fits(columns, values):
                    for key, value in values.items():
                        column = columns[key]
                        if not np.can_cast(value.dtype, column.dtype, "safe"):
                            column = columns[key] = column.astype(
                                np.result_type(column.dtype, value.dtype)
                            )
                        column[slots] = value
                    return
            self._to_objects()
        super()._store(slots, items)

    def _to_objects(self) -> None:
        if self._columns is not None:
            for slot in np.flatnonzero(self.ids >= 0).tolist():
                self.items[slot] = self.row(slot)
        self._columns, self._objects = None, True


Column = Union[str, tuple[str, str]]  # a key, or (key, its dict's key)


def _fits(columns: dict[Column, np.ndarray], values: dict[Column, np.ndarray]) -> bool:
    return values.keys() == columns.keys() and all(
        value.shape[1:] == columns[key].shape[1:] for key, value in values.items()
    )


def _as_columns(items: list, nested: bool = True) -> Optional[dict[Column, np.ndarray]]:
    """{key: array [len(items), ...]} for dicts of numbers/arrays with one key set, a value
    that is a dict of those (when `nested`) giving (key, its key) columns; else None."""
    first = items[0]
    if type(first) is not dict or not first:
        return None
    keys = first.keys()
    if any(type(item) is not dict or item.keys() != keys for item in items):
        return None
    out: dict[Column, np.ndarray] = {}
    for key in keys:
        values = [item[key] for item in items]
        if nested and type(values[0]) is dict:
            # (a flat call's columns are named by the inner dicts' own keys)
            inner: Optional[dict[Any, np.ndarray]] = _as_columns(values, nested=False)
            if inner is None:
                return None
            out.update(((key, k), v) for k, v in inner.items())
            continue
        try:
            value = np.asarray(values)
        except (ValueError, TypeError, RuntimeError):  # ragged, or not convertible
            return None
        if value.dtype.kind not in _NUMERIC_KINDS:
            return None
        out[key] = value
    return out


def _flat_columns(columns: dict[str, Any]) -> Optional[dict[Column, np.ndarray]]:
    """A `TransitionBatch`'s columns in `_as_columns`' layout, or None: not all numeric."""
    out: dict[Column, np.ndarray] = {}
    for key, value in columns.items():
        parts = value.items() if type(value) is dict else ((None, value),)
        for inner, array in parts:
            array = np.asarray(array)
            if array.dtype.kind not in _NUMERIC_KINDS:
                return None
            out[key if inner is None else (key, inner)] = array
    return out


def _nested(columns: dict[Column, Any]) -> dict[str, Any]:
    """`_as_columns`' flat layout back in the items' shape: (key, k) columns under key."""
    out: dict[str, Any] = {}
    for column, value in columns.items():
        if isinstance(column, tuple):
            out.setdefault(column[0], {})[column[1]] = value
        else:
            out[column] = value
    return out
