"""Replay of whole episodes, or of fixed-length windows cut from them (for recurrent learners)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mistk_rl.rl.data.buffers.naive import NaiveReplayBuffer
from mistk_rl.rl.data.collate import default_collate
from mistk_rl.rl.data.buffers.storage import Ring

Episode = list[dict]


def zeros_like(value: Any) -> Any:
    """A zero of the same structure, type and shape; values with no zero (str, None) are kept."""
    if isinstance(value, dict):
        return {key: zeros_like(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(zeros_like(item) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(zeros_like(item) for item in value)
    if isinstance(value, np.ndarray):
        return np.zeros_like(value)
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, (bool, int, float, complex, np.number, np.bool_)):
        return type(value)(0)
    return value


def as_episode(episode: Any) -> Episode:
    if not isinstance(episode, (list, tuple)) or not episode:
        raise TypeError("an episode is a non-empty list of transition dicts")
    if not all(isinstance(step, dict) for step in episode):
        raise TypeError("an episode is a list of transition dicts; to push several episodes "
                        "at once use push_episodes(list_of_episodes)")
    return list(episode)


class EpisodeReplayBuffer(NaiveReplayBuffer):
    """A ring of ``replay_buffer_size`` episodes (each a list of transition dicts).

    ``push(episode)`` stores exactly one episode and ``push_episodes(episodes)`` several, so a
    list is never guessed at. ``sample(size)`` returns ``size`` distinct whole episodes
    (uniformly, None if fewer are stored); ``sample(size, unroll_len=L)`` returns ``size``
    windows of L steps (see ``sample``). ``collect_iter`` is accepted for the common interface
    and not used.
    """

    _ring_cls = Ring  # episodes are lists: object storage

    @classmethod
    def default_config(cls) -> dict:
        return {"replay_buffer_size": 1000}

    def __init__(self, config: dict | None = None, seed: int | None = None) -> None:
        super().__init__(config, seed)
        self._lengths = np.zeros(self._ring.size, dtype=np.int64)

    def push(self, episode: Episode, collect_iter: int = 0) -> bool:
        return self.push_episodes([episode], collect_iter)

    def push_episodes(self, episodes: list[Episode], collect_iter: int = 0) -> bool:
        episodes = [as_episode(episode) for episode in episodes]
        slots = self._ring.put(episodes)
        self._lengths[slots] = [len(episode) for episode in episodes[-len(slots):]]
        return True

    def sample(self, size: int, learner_iter: int = 0,
               unroll_len: int | None = None) -> list[Episode] | None:
        """Whole episodes, or ``size`` windows of ``unroll_len`` steps.

        Window starts are drawn uniformly, with replacement, over every valid start of every
        stored episode (an episode of length T >= L has T - L + 1 starts, a shorter one has one),
        so long episodes are drawn in proportion to their length and each window lies inside
        one episode. A window of a short episode is padded at the end with zeros-like copies of
        its last step; every step of a window carries ``"mask"`` (True for real steps).
        """
        if unroll_len is None:
            slots = self._uniform_slots(size)
            return None if slots is None else [self._tagged(slot) for slot in slots.tolist()]
        if size < 1 or unroll_len < 1:
            raise ValueError(f"size and unroll_len must be >= 1, got {size}, {unroll_len}")
        starts = np.where(self._ring.valid, np.maximum(self._lengths - unroll_len + 1, 1), 0)
        bounds = np.cumsum(starts)
        if bounds[-1] == 0:
            return None
        draws = self._rng.integers(bounds[-1], size=size)
        slots = np.searchsorted(bounds, draws, side="right")
        offsets = draws - (bounds[slots] - starts[slots])
        return [self._window(slot, start, unroll_len)
                for slot, start in zip(slots.tolist(), offsets.tolist())]

    def clear(self) -> None:
        super().clear()
        self._lengths.fill(0)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._lengths = np.array([len(ep) if ep is not None else 0 for ep in self._ring.items],
                                 dtype=np.int64)

    def sample_batch(self, size: int, learner_iter: int = 0,
                     unroll_len: int | None = None) -> dict[str, Any] | None:
        """``sample(size, unroll_len=L)`` collated to tensors [size, L, ...] (whole episodes
        differ in length, so L is required)."""
        if unroll_len is None:
            raise ValueError("EpisodeReplayBuffer.sample_batch needs unroll_len: whole "
                             "episodes differ in length")
        windows = self.sample(size, learner_iter, unroll_len)
        return None if windows is None else default_collate([default_collate(w) for w in windows])

    def _tagged(self, slot: int) -> Episode:
        meta = self._ring.meta(slot)
        return [{**step, **meta} for step in self._ring.items[slot]]

    def _window(self, slot: int, start: int, length: int) -> Episode:
        episode = self._ring.items[slot]
        real = {**self._ring.meta(slot), "mask": True}
        steps = [{**step, **real} for step in episode[start:start + length]]
        if len(steps) < length:
            pad = {**zeros_like(episode[-1]), **real, "mask": False}
            steps += [dict(pad) for _ in range(length - len(steps))]
        return steps
