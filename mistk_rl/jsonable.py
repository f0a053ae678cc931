"""Turn numpy values (arrays, scalars, nested in dicts and lists) into JSON-ready Python."""
from __future__ import annotations

from typing import Any

import numpy as np


def to_jsonable(value: Any) -> Any:
    """Arrays become nested lists, numpy scalars Python numbers; containers are walked."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
