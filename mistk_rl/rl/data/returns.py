"""n-step settings and generalized advantage estimation (n-step returns themselves are computed
on columns: `mistk_rl.rl.data.transition_batch.NStepColumns`).

Episode ends follow gymnasium: ``terminated`` means the MDP ended (no bootstrap), while
``truncated`` only cuts the episode (the learner still bootstraps from ``next_obs``).
"""

from __future__ import annotations

import numpy as np


def check_nstep(n: int, gamma: float) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


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
