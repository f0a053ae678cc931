"""Values the kit sends and judges: observations and actions as JSON, whether an action
is in its space, an action that is not."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from mistk_rl.wire.jsonable import to_jsonable


def json_value(value: Any) -> Any:
    """A numpy value (or a dict of them) as plain JSON."""
    return to_jsonable(value)


def in_space(space: gym.Space, action: Any) -> bool:
    try:
        value = np.asarray(action)
        if isinstance(space, gym.spaces.Discrete):
            return value.shape == () and float(value) == int(value) and space.contains(int(value))
        return bool(space.contains(value.astype(space.dtype)))
    except (TypeError, ValueError):
        return False


def outside(space: gym.Space) -> Any:
    """An action the space does not hold."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start + space.n + 5)
    return json_value(np.zeros(np.asarray(space.sample()).size + 1))  # (a shape it is not)
