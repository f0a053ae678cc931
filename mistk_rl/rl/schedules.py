"""Schedules: a value (exploration epsilon, learning rate, ...) as a function of the step.

Each schedule is a small frozen dataclass that is called with the step, so it pickles, prints
its parameters in logs and compares by value. `make_schedule` builds one from a config dict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

Schedule = Callable[[int], float]


@dataclass(frozen=True)
class ConstantSchedule:
    """Always `value`."""

    value: float

    def __call__(self, step: int) -> float:
        return float(self.value)


@dataclass(frozen=True)
class LinearSchedule:
    """From `start` to `end` over `duration` steps, then stays at `end` (CleanRL's epsilon)."""

    start: float
    end: float
    duration: int

    def __post_init__(self) -> None:
        if self.duration <= 0:
            raise ValueError(f"duration must be > 0, got {self.duration}")

    def __call__(self, step: int) -> float:
        fraction = min(max(step, 0) / self.duration, 1.0)
        return self.start + fraction * (self.end - self.start)


@dataclass(frozen=True)
class ExponentialSchedule:
    """`end + (start - end) * exp(-step / decay)`: DI-engine's epsilon, reaching `end`
    only asymptotically (about 37% of the gap remains after `decay` steps)."""

    start: float
    end: float
    decay: float

    def __post_init__(self) -> None:
        if self.decay <= 0:
            raise ValueError(f"decay must be > 0, got {self.decay}")

    def __call__(self, step: int) -> float:
        return self.end + (self.start - self.end) * math.exp(-max(step, 0) / self.decay)


# The names a config uses, and the lowercase factories the rest of the code calls.
constant = ConstantSchedule
linear = LinearSchedule
exponential = ExponentialSchedule
SCHEDULES: dict[str, type] = {
    "constant": ConstantSchedule,
    "linear": LinearSchedule,
    "exponential": ExponentialSchedule,
}


def make_schedule(spec: Mapping[str, Any]) -> Schedule:
    """Build a schedule from `{"type": "linear", "start": 1.0, "end": 0.05, "duration": 10000}`.

    Raises ValueError for an unknown type or missing/unknown parameters, naming the valid ones.
    """
    params = dict(spec)
    kind = params.pop("type", None)
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule type {kind!r}; valid types: {', '.join(SCHEDULES)}")
    cls = SCHEDULES[kind]
    expected = [f.name for f in fields(cls)]
    if sorted(params) != sorted(expected):
        raise ValueError(
            f"schedule {kind!r} takes parameters {', '.join(expected)}; "
            f"got {', '.join(params) or 'none'}"
        )
    return cls(**params)
