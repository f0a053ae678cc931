"""The loop each subprocess env runs: commands over a pipe, observations in shared memory.

The pipe carries only small things (reward, flags, info, and the final observation when an
episode ends); the observation itself is written into the env's shared-memory block, which the
parent reads without a copy through the pipe. Episodes reset here, in the child, so an episode
end costs no extra round trip.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable, Optional

import numpy as np


def run_worker(env_fn: Callable, conn: Any, shared: Any, shape: tuple, dtype: str) -> None:
    _one_thread()
    view: Optional[np.ndarray] = (
        None if shared is None else np.frombuffer(shared, dtype=np.dtype(dtype)).reshape(shape)
    )
    env = None
    try:
        env = env_fn()
        while True:
            command, arg = conn.recv()
            try:
                if command == "step":
                    conn.send(("ok", step_env(env, view, arg)))
                elif command == "reset":
                    obs, info = env.reset(seed=arg)
                    conn.send(("ok", (_publish(view, obs), info)))
                elif command == "close":
                    break
                else:
                    raise ValueError(f"unknown command {command!r}")
            except Exception:  # noqa: BLE001 - the parent restarts this env
                conn.send(("error", traceback.format_exc(limit=5)))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass  # the parent went away: exit quietly
    finally:
        if env is not None:
            env.close()
        conn.close()


def _one_thread() -> None:
    """Many env processes share the cores: keep each to one math thread. Importing torch
    here just to say so would cost each worker a second or more (256 workers: minutes), so
    a library imported later reads the environment, and one already imported is told."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def step_env(env: Any, view: Optional[np.ndarray], action: Any) -> tuple:
    """One step, and the next episode's reset when this one ended: (reward, terminated,
    truncated, info, the final obs or None, the next obs (None: written into `view`),
    the next obs's info). Also what a Ray env actor runs (`ray_workers`)."""
    obs, reward, terminated, truncated, info = env.step(action)
    final, next_info = None, info
    if terminated or truncated:
        final, (obs, next_info) = obs, env.reset()
    return (
        float(reward),
        bool(terminated),
        bool(truncated),
        info,
        final,
        _publish(view, obs),
        next_info,
    )


def _publish(view: Optional[np.ndarray], obs: Any) -> Any:
    """Write obs into shared memory (returns None), or return it to send through the pipe."""
    if view is None:
        return obs
    view[...] = obs
    return None
