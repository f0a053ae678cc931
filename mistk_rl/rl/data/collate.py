"""Turn a list of samples into one batch of tensors, keeping the nesting.

Rules, applied recursively with the first item deciding the structure:
- dict: collated key by key (all items must have the same keys);
- tuple / namedtuple: collated position by position, same tuple type back;
- torch tensors, numpy arrays / scalars, python bools / ints / floats, and lists of numbers:
  stacked along a new dim 0 (floats -> float32, bools -> bool, ints -> int64 except uint8,
  kept so image observations stay 8-bit);
- anything else (str, None, objects, lists that are not numeric): left as a list of values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from typing_extensions import TypeIs

_NUMERIC_KINDS = "biufc"


def _normalise_dtype(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype == torch.bool or tensor.dtype == torch.uint8:
        return tensor
    if tensor.is_floating_point():
        return tensor.to(torch.float32)
    if tensor.is_complex():
        return tensor
    return tensor.to(torch.int64)


def to_batch_tensor(array: np.ndarray | Mapping[str, np.ndarray]) -> Any:
    """A stacked numeric array as a batch tensor, with the dtype rules above; a dict of them
    (a Dict space's observations) as a dict of tensors."""
    if _is_mapping(array):
        return {key: to_batch_tensor(value) for key, value in array.items()}
    return _normalise_dtype(torch.from_numpy(np.ascontiguousarray(array)))


# ---- batches of observations: a tensor, or for a Dict space a dict of tensors (one per key)
Batch = torch.Tensor | dict[str, torch.Tensor]


def stack_observations(observations: list) -> Batch:
    """Entities' observations (arrays, or dicts of arrays) as one batch, dtypes as they
    came: the models' encoders scale and convert (uint8 planes stay 8-bit until then)."""
    first = observations[0]
    if _is_mapping(first):
        return {
            key: torch.as_tensor(np.stack([np.asarray(o[key]) for o in observations]))
            for key in first
        }
    return torch.as_tensor(np.stack([np.asarray(o) for o in observations]))


def batch_len(batch: Batch) -> int:
    """The rows of a batch of observations."""
    if _is_mapping(batch):
        return int(next(iter(batch.values())).shape[0])
    return int(batch.shape[0])


def batch_rows(batch: Batch, rows: Any) -> Batch:
    """Rows `rows` (an index, slice or index tensor) of a batch of observations."""
    if _is_mapping(batch):
        return {key: value[rows] for key, value in batch.items()}
    return batch[rows]


def to_device(value: Any, device: torch.device) -> Any:
    """`value` with its tensors on `device` (`mistk_rl.rl.device`): a tensor, a dict of
    them (a Dict space's batch) or a typed batch (`samples`' NamedTuples); other leaves
    (None, numbers) as they are. A tensor already there is returned itself, not copied, so
    on the CPU this changes nothing."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if _is_mapping(value):
        return {key: to_device(item, device) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_device(item, device) for item in value))
    return value


def concat(batches: list[Batch]) -> Batch:
    """Batches of observations (or other tensors) one after another, along dim 0; all of
    one kind (the first's)."""
    if _is_mapping(batches[0]):
        dicts = cast("list[dict[str, torch.Tensor]]", batches)
        return {key: torch.cat([b[key] for b in dicts]) for key in dicts[0]}
    return torch.cat(cast("list[torch.Tensor]", batches))


def _stack(values: list, path: str) -> torch.Tensor | list:
    """Stack leaves into a tensor, or keep them as a list when they are not numeric."""
    if isinstance(values[0], torch.Tensor):
        try:
            return _normalise_dtype(torch.stack(values))
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"cannot stack field {path or '<root>'}: {exc}") from exc
    try:
        array = np.asarray(values)
    except ValueError as exc:  # ragged shapes
        raise ValueError(f"cannot stack field {path or '<root>'}: {exc}") from exc
    if array.dtype.kind not in _NUMERIC_KINDS:
        return list(values)
    return to_batch_tensor(array)


def _is_mapping(value: Any) -> TypeIs[Mapping[str, object]]:
    # (object, not Any: then a Batch that is not a mapping narrows to a tensor, too)
    return type(value) is dict or isinstance(value, Mapping)  # the cheap check first


def _collate(batch: list, path: str) -> Any:
    first = batch[0]
    if _is_mapping(first):
        first_keys = first.keys()
        for item in batch:
            if not _is_mapping(item) or item.keys() != first_keys:
                raise ValueError(
                    f"items differ at {path or '<root>'}: expected keys "
                    f"{sorted(map(str, first_keys))}, got {item!r:.200}"
                )
        return {
            key: _collate([item[key] for item in batch], f"{path}.{key}".lstrip("."))
            for key in first_keys
        }
    if isinstance(first, tuple):
        if any(not isinstance(item, tuple) or len(item) != len(first) for item in batch):
            raise ValueError(f"items differ at {path or '<root>'}: tuples of unequal length")
        columns = [_collate(list(column), f"{path}[{i}]") for i, column in enumerate(zip(*batch))]
        return type(first)(*columns) if hasattr(first, "_fields") else tuple(columns)
    return _stack(batch, path)


def default_collate(batch: list) -> Any:
    """A list of samples -> the same structure with a batch dim (see the module doc)."""
    if not isinstance(batch, (list, tuple)) or not batch:
        raise ValueError("default_collate needs a non-empty list of samples")
    return _collate(list(batch), "")
