"""The replay-buffer interface and the pieces every buffer shares: config merge, ring storage."""
from __future__ import annotations

import abc
import copy
from typing import Any

import numpy as np


def merge_config(defaults: dict, config: dict | None, path: str = "") -> dict:
    """Deep-merge ``config`` over ``defaults``; a key the defaults lack is a typo, so refuse it."""
    merged = copy.deepcopy(defaults)
    for key, value in (config or {}).items():
        name = f"{path}{key}"
        if key not in defaults:
            raise ValueError(f"unknown config key {name!r}; valid keys: {sorted(defaults)}")
        if isinstance(defaults[key], dict):
            if not isinstance(value, dict):
                raise ValueError(f"config key {name!r} must be a dict, got {value!r}")
            merged[key] = merge_config(defaults[key], value, f"{name}.")
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def as_transitions(data: dict | list[dict] | tuple[dict, ...]) -> list[dict]:
    """One transition dict or a list of them, as a list; anything else is a caller bug."""
    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, (list, tuple)) or not all(isinstance(d, dict) for d in items):
        raise TypeError("push takes a transition dict or a list of transition dicts")
    return list(items)


class ReplayBuffer(abc.ABC):
    """What every buffer offers the learner and the collector.

    Each buffer owns its ``np.random.Generator`` (seeded by ``seed``) and saves its state in
    ``state_dict``, so a restored buffer draws exactly the samples the original would have.
    """

    # whether `update` uses the priorities a learner computes (callers skip it otherwise)
    takes_priority_feedback = False

    def __init__(self, config: dict | None = None, seed: int | None = None) -> None:
        self.config = merge_config(self.default_config(), config)
        self._rng = np.random.default_rng(seed)

    @classmethod
    @abc.abstractmethod
    def default_config(cls) -> dict:
        """The full set of config keys with their defaults (a fresh plain dict)."""

    @abc.abstractmethod
    def push(self, data: Any, collect_iter: int = 0) -> bool:
        """Store data; False when the buffer refused it (nothing was stored then)."""

    @abc.abstractmethod
    def update(self, info: dict) -> None:
        """Feed back information about sampled items (e.g. new priorities)."""

    @abc.abstractmethod
    def sample(self, size: int, learner_iter: int = 0) -> list | None:
        """``size`` items with meta keys added, or None when there is not enough valid data."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Drop all data (unique ids keep counting, so old ids never come back)."""

    @abc.abstractmethod
    def count(self) -> int:
        """Number of valid (sampleable) items."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume, as plain python / numpy content (picklable)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict`` taken from a buffer of the same size."""

    def _rng_state(self) -> dict:
        return copy.deepcopy(self._rng.bit_generator.state)

    def _load_rng_state(self, state: dict) -> None:
        self._rng.bit_generator.state = copy.deepcopy(state)


class Ring:
    """Fixed-size FIFO storage in which the item with unique id k always lives in slot k % size.

    Ids grow forever (``clear`` keeps counting), so the slot of an id needs no lookup table and
    comparing a slot's current id with a remembered one tells whether the reference is stale.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"replay_buffer_size must be >= 1, got {size}")
        self.size = int(size)
        self.items: list[Any] = [None] * self.size
        self.ids = np.full(self.size, -1, dtype=np.int64)
        self.valid = np.zeros(self.size, dtype=bool)
        self.next_id = 0

    def put(self, items: list) -> np.ndarray:
        """Store items at the tail and return their slots.

        Only the newest ``size`` items are kept when more are given (the rest would be
        overwritten at once); the returned slots line up with ``items[-len(slots):]``.
        """
        items = items[-self.size:]
        ids = np.arange(self.next_id, self.next_id + len(items), dtype=np.int64)
        slots = ids % self.size
        for slot, item in zip(slots.tolist(), items):
            self.items[slot] = item
        self.ids[slots] = ids
        self.valid[slots] = True
        self.next_id += len(items)
        return slots

    def slots_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of ``ids`` and a mask of those that still hold that id and valid data."""
        ids = np.asarray(ids, dtype=np.int64)
        slots = ids % self.size
        return slots, (self.ids[slots] == ids) & self.valid[slots]

    def meta(self, slot: int) -> dict:
        return {"replay_unique_id": int(self.ids[slot]), "replay_buffer_idx": int(slot)}

    def valid_slots(self) -> np.ndarray:
        return np.flatnonzero(self.valid)

    def count(self) -> int:
        return int(np.count_nonzero(self.valid))

    def clear(self) -> None:
        self.items = [None] * self.size
        self.ids.fill(-1)
        self.valid.fill(False)

    def state_dict(self) -> dict:
        return {"items": list(self.items), "ids": self.ids.copy(), "valid": self.valid.copy(),
                "next_id": self.next_id}

    def load_state_dict(self, state: dict) -> None:
        if len(state["items"]) != self.size:
            raise ValueError(f"state holds {len(state['items'])} slots, this buffer has "
                             f"replay_buffer_size {self.size}")
        self.items = list(state["items"])
        self.ids = np.array(state["ids"], dtype=np.int64)
        self.valid = np.array(state["valid"], dtype=bool)
        self.next_id = int(state["next_id"])
