"""Waiting awake: how long an SDK client polls for an answer, and a service for its next
request, before blocking (`mistk_rl.sdk.transport`'s module doc says why). One setting for
both sides, ``MISTK_RL_SPIN_US``, read here."""

from __future__ import annotations

import os

SPIN_ENV = "MISTK_RL_SPIN_US"  # microseconds each answer is waited for awake
MAX_SPIN = 0.01  # seconds: a longer wait is better spent asleep
DEFAULT_SPIN = 1e-3  # seconds clients and services poll when the variable is unset


def spin_from_env() -> float:
    """The spin ``MISTK_RL_SPIN_US`` asks for, in seconds (0 when it is unset or empty); a
    ValueError naming it when it is not a number of microseconds from 0 to `MAX_SPIN`."""
    raw = os.environ.get(SPIN_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        spin = float(raw) / 1e6
    except ValueError:
        spin = -1.0
    if not 0 <= spin <= MAX_SPIN:  # (also NaN)
        raise ValueError(
            f"{SPIN_ENV}={raw!r}: give the microseconds to wait for an answer "
            f"awake, 0 to {MAX_SPIN * 1e6:.0f}"
        )
    return spin


def default_spin() -> float:
    """The spin this process's SDK clients wait for answers with, and its services for the
    next request: ``MISTK_RL_SPIN_US`` when set, else `DEFAULT_SPIN` for a
    process that may run on two CPUs or more, else 0 (on one CPU the poller would keep the
    process it waits for from running)."""
    if os.environ.get(SPIN_ENV, "").strip():
        return spin_from_env()
    usable = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return DEFAULT_SPIN if usable >= 2 else 0.0
