"""A batch of env copies as columns: one row per copy, an array ``[N, ...]``, or for a Dict
space one such array per key. What the step path carries from the orchestrator's stepper
through the wire to the service's kept steps and the agent's transitions."""

from __future__ import annotations

from typing import Any, Union, cast

import numpy as np

Columns = Union[np.ndarray, dict[str, np.ndarray]]
"""One row per env copy: an array [N, ...], or for a Dict space one such array per key."""


def take_rows(columns: Columns, rows: Any) -> Columns:
    """Rows of columns (a Dict space's: of each key's)."""
    if isinstance(columns, dict):
        return {key: column[rows] for key, column in columns.items()}
    return columns[rows]


def concat_rows(parts: list[Columns]) -> Columns:
    """Columns one after the other (a Dict space's: key by key)."""
    if isinstance(parts[0], dict):
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    return np.concatenate(cast(list[np.ndarray], parts))
