"""Streaming n-step transitions and generalized advantage estimation.

Episode ends follow gymnasium: ``terminated`` means the MDP ended (no bootstrap), while
``truncated`` only cuts the episode (the learner still bootstraps from ``next_obs``).
"""

from __future__ import annotations

from collections import deque

import numpy as np


def _check_nstep(n: int, gamma: float) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


def _nstep_item(first: dict, last: dict, reward: float, m: int, gamma: float) -> dict:
    """The n-step transition from step ``first`` whose window of ``m`` steps ends at ``last``.

    ``terminated`` / ``truncated`` come from the window's last step: an episode end can only
    be there, since a window never crosses one.
    """
    item = {
        **first,
        "reward": float(reward),
        "next_obs": last["next_obs"],
        "terminated": bool(last["terminated"]),
        "truncated": bool(last["truncated"]),
        "gamma_n": float(gamma**m),
    }
    if "next_action_mask" in last:  # the legal actions belong to next_obs, the window's end
        item["next_action_mask"] = last["next_action_mask"]
    return item


def _ends_episode(step: dict) -> bool:
    return bool(step["terminated"]) or bool(step["truncated"])


class NStepAccumulator:
    """n-step transitions of a stream that arrives one transition at a time.

    Item t: reward = sum_{k<m} gamma^k r_{t+k} with m = min(n, steps to the episode's end,
    inclusive, or to the stream's cut); next_obs of step t+m-1; gamma_n = gamma**m, so the
    learner's target is reward + gamma_n * (1 - terminated) * Q(next_obs). Other keys are
    copied from step t. ``push`` returns the items it completes: the oldest pending one once n
    are pending, or all pending ones when the pushed transition ends the episode. Call
    ``flush`` when a stream is cut without an episode end.
    """

    def __init__(self, n: int, gamma: float) -> None:
        _check_nstep(n, gamma)
        self.n, self.gamma = n, gamma
        self._pending: deque[dict] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, transition: dict) -> list[dict]:
        if self.n == 1:  # (every step is an item at once: no window to keep)
            return [_nstep_item(transition, transition, float(transition["reward"]), 1, self.gamma)]
        self._pending.append(transition)
        if _ends_episode(transition):
            return self.flush()
        if len(self._pending) == self.n:
            item = self._emit_oldest()
            return [item]
        return []

    def pending(self) -> list[dict]:
        """The steps whose items are not complete yet (oldest first)."""
        return list(self._pending)

    def flush(self) -> list[dict]:
        """Emit every pending item (windows end at the last pending step) and start afresh."""
        items = []
        while self._pending:
            items.append(self._emit_oldest())
        return items

    def _emit_oldest(self) -> dict:
        window = self._pending
        reward = 0.0
        for k, step in enumerate(window):
            reward += self.gamma**k * float(step["reward"])
        item = _nstep_item(window[0], window[-1], reward, len(window), self.gamma)
        window.popleft()
        return item


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation over time-major arrays of shape [T] or [T, N].

    delta_t = r_t + gamma * next_values_t * (1 - terminated_t) - values_t and
    A_t = delta_t + gamma * lam * (1 - dones_t) * A_{t+1}, with dones = terminated | truncated:
    at a truncation the recursion stops but next_values_t (the value of the final obs) still
    bootstraps delta_t. Returns (advantages, returns = advantages + values).
    """
    arrays = [np.asarray(a) for a in (rewards, values, next_values, terminated, dones)]
    shape = arrays[1].shape
    if any(a.shape != shape for a in arrays) or len(shape) not in (1, 2):
        raise ValueError(f"gae needs equal shapes [T] or [T, N], got {[a.shape for a in arrays]}")
    rewards, values, next_values = arrays[:3]
    dtype = np.promote_types(values.dtype, np.float32)
    not_terminated = 1.0 - arrays[3].astype(dtype)
    not_done = 1.0 - arrays[4].astype(dtype)
    deltas = rewards + gamma * next_values * not_terminated - values
    advantages = np.zeros(shape, dtype=dtype)
    running = np.zeros(shape[1:], dtype=dtype)
    for t in reversed(range(shape[0])):  # the recursion runs over time; envs are vectorised
        running = deltas[t] + gamma * lam * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values
