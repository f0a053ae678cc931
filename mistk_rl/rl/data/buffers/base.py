"""The replay-buffer interface and the pieces every buffer shares: config, random state,
sampling from ring storage (`storage.py`) as items or as one collated batch."""

from __future__ import annotations

import abc
import copy
from typing import Any, Union

import numpy as np

from mistk_rl.rl.config import deep_merge
from mistk_rl.rl.data.buffers.storage import TransitionRing
from mistk_rl.rl.data.collate import default_collate, to_batch_tensor
from mistk_rl.rl.data.samples import ReplaySamples
from mistk_rl.rl.data.transition_batch import TransitionBatch

Pushed = Union[dict, list[dict], tuple[dict, ...], TransitionBatch]


def as_transitions(data: Pushed) -> list[dict] | TransitionBatch:
    """One transition dict or a list of them, as a list, or a batch of them in columns (kept
    as columns: the ring stores them without a dict per row); anything else is a caller bug."""
    if isinstance(data, TransitionBatch):
        return data
    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, (list, tuple)) or not all(isinstance(d, dict) for d in items):
        raise TypeError("push takes a transition dict or a list of transition dicts")
    return list(items)


Meta = dict[str, np.ndarray]  # meta key -> one value per drawn slot


class ReplayBuffer(abc.ABC):
    """A buffer of single transitions in a `TransitionRing`: subclasses choose the slots of
    a sample (`_draw`) and the meta keys that go with them; items and batches are built here.

    Each buffer owns its ``np.random.Generator`` (seeded by ``seed``) and saves its state in
    ``state_dict``, so a restored buffer draws exactly the samples the original would have.
    """

    # whether `update` uses the priorities a learner computes (callers skip it otherwise)
    takes_priority_feedback = False

    def __init__(self, config: dict | None = None, seed: int | None = None) -> None:
        self.config = deep_merge(self.default_config(), config)
        self._rng = np.random.default_rng(seed)
        self._ring = TransitionRing(self.config["replay_buffer_size"])

    @classmethod
    @abc.abstractmethod
    def default_config(cls) -> dict:
        """The full set of config keys with their defaults (a fresh plain dict)."""

    @abc.abstractmethod
    def push(self, data: Pushed, collect_iter: int = 0) -> bool:
        """Store transitions (dicts, or a `TransitionBatch`); False when the buffer refused
        them (nothing was stored then)."""

    @abc.abstractmethod
    def update(self, info: dict) -> None:
        """Feed back information about sampled items (e.g. new priorities)."""

    @abc.abstractmethod
    def _draw(self, size: int, learner_iter: int) -> tuple[np.ndarray, Meta] | None:
        """The slots of the next sample and their meta values, or None (refused / too few)."""

    def sample(self, size: int, learner_iter: int = 0) -> list[dict] | None:
        """``size`` items (copies) with meta keys added, or None when there is not enough
        valid data."""
        drawn = self._draw(size, learner_iter)
        return None if drawn is None else self._items(*drawn)

    def sample_batch(self, size: int, learner_iter: int = 0) -> ReplaySamples | None:
        """The same draw as `sample`, as the typed batch a learner takes: the fields hold
        what ``default_collate(sample(...))`` gives (tensors with a batch dim), built from
        the columns without a dict per item."""
        drawn = self._draw(size, learner_iter)
        if drawn is None:
            return None
        slots, meta = drawn
        columns = self._ring.columns(slots)
        if columns is None:  # object storage: collate the items
            return ReplaySamples.from_columns(default_collate(self._items(slots, meta)))
        columns.update(meta)
        return ReplaySamples.from_columns(
            {key: to_batch_tensor(value) for key, value in columns.items()}
        )

    @abc.abstractmethod
    def clear(self) -> None:
        """Drop all data (unique ids keep counting, so old ids never come back)."""

    @abc.abstractmethod
    def count(self) -> int:
        """Number of valid (sampleable) items."""

    def stats(self) -> dict[str, Any]:
        """What the buffer counts, for the agent's status: here the valid items."""
        return {"count": self.count()}

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume, as plain python / numpy content (picklable)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict`` taken from a buffer of the same size."""

    def _rng_state(self) -> dict:
        return copy.deepcopy(dict(self._rng.bit_generator.state))

    def _load_rng_state(self, state: dict) -> None:
        self._rng.bit_generator.state = copy.deepcopy(state)

    def _items(self, slots: np.ndarray, meta: Meta) -> list[dict]:
        """Each drawn item (a copy) with its meta keys."""
        rows = zip(*(values.tolist() for values in meta.values()))
        return [
            {**self._ring.row(slot), **dict(zip(meta, values))}
            for slot, values in zip(slots.tolist(), rows)
        ]
