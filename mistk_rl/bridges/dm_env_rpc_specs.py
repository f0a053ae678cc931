"""gymnasium spaces and dm_env_rpc tensor specs, both ways, and tensors read by their spec.

A gymnasium env as dm_env_rpc sees it (`env_specs`): one observation tensor (``observation``)
or one per key of a Dict space, a scalar ``reward``, an ``action_mask`` (bool, one per
action) when the env puts one in its info, and one action tensor (``action``).

| gymnasium | dm_env_rpc tensor spec |
| --- | --- |
| Box | its dtype (float32: FLOAT, uint8: UINT8, ...), its shape, low/high as min/max |
| Discrete(n, start) | INT64 scalar, min start, max start + n - 1 |
| MultiDiscrete(nvec, start) | INT64 of nvec's shape, min start, max start + nvec - 1 |
| MultiBinary(shape) | BOOL of that shape |

Read back (`space_of`), a bounded integer scalar is Discrete, a bounded integer array is
MultiDiscrete when it is an action and a Box when it is an observation (an image of uint8
in 0..255 is a Box, not 256 choices a pixel), a bool array MultiBinary, a float tensor a Box.
Strings, protos and variable dimensions have no gymnasium space the services carry: they are
refused with `UnsupportedSpec`, which says which tensor and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import gymnasium as gym
import numpy as np
from dm_env_rpc.v1 import dm_env_rpc_pb2 as pb
from dm_env_rpc.v1 import tensor_spec_utils, tensor_utils

OBSERVATION, REWARD, DISCOUNT, MASK, ACTION = (
    "observation",
    "reward",
    "discount",
    "action_mask",
    "action",
)
RESERVED = (REWARD, DISCOUNT, MASK)  # observations that are not the agent's observation


class UnsupportedSpec(ValueError):
    """A space with no tensor spec, or a tensor spec with no space the services carry."""


# ---- gymnasium -> dm_env_rpc ----------------------------------------------------------------
def tensor_spec(name: str, space: gym.Space) -> pb.TensorSpec:
    """The tensor spec of one fundamental space (the table above)."""
    if isinstance(space, gym.spaces.Box):
        try:
            dtype = tensor_utils.np_type_to_data_type(space.dtype)
        except TypeError as exc:
            raise UnsupportedSpec(f"{name}: Box of dtype {space.dtype}: {exc}") from exc
        spec = pb.TensorSpec(name=name, shape=space.shape, dtype=dtype)
        low, high = _bound(space.low, -np.inf), _bound(space.high, np.inf)
        if low is not None or high is not None:
            tensor_spec_utils.set_bounds(spec, low, high)
        return spec
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        nvec = np.asarray(space.n if isinstance(space, gym.spaces.Discrete) else space.nvec)
        start = np.broadcast_to(np.asarray(space.start, np.int64), nvec.shape)
        spec = pb.TensorSpec(name=name, shape=nvec.shape, dtype=pb.DataType.INT64)
        tensor_spec_utils.set_bounds(spec, _compact(start), _compact(start + nvec - 1))
        return spec
    if isinstance(space, gym.spaces.MultiBinary):
        return pb.TensorSpec(name=name, shape=space.shape, dtype=pb.DataType.BOOL)
    raise UnsupportedSpec(
        f"{name}: {space} has no dm_env_rpc tensor spec here "
        "(Box, Discrete, MultiDiscrete, MultiBinary, or a Dict of those)"
    )


def _bound(values: np.ndarray, unbounded: float) -> Optional[Any]:
    """A Box bound for set_bounds: None when every element is unbounded, else one scalar
    when all are equal, else the array."""
    if np.issubdtype(values.dtype, np.floating) and np.all(values == unbounded):
        return None
    return _compact(values)


def _compact(values: np.ndarray) -> Any:
    flat = np.asarray(values).ravel()
    return flat[0] if flat.size and np.all(flat == flat[0]) else np.asarray(values)


def env_specs(
    observation_space: gym.Space, action_space: gym.Space, mask: bool
) -> pb.ActionObservationSpecs:
    """The specs a gymnasium env is served with (uids from 1, in the module's order)."""
    parts = (
        dict(observation_space.spaces)
        if isinstance(observation_space, gym.spaces.Dict)
        else {OBSERVATION: observation_space}
    )
    clash = sorted(set(parts) & set(RESERVED))
    if clash:
        raise UnsupportedSpec(f"observation keys {clash} clash with dm_env_rpc's own names")
    observations = [tensor_spec(key, space) for key, space in parts.items()]
    observations.append(pb.TensorSpec(name=REWARD, dtype=pb.DataType.DOUBLE))
    if mask:
        n = getattr(action_space, "n", None)
        if n is None:
            raise UnsupportedSpec(f"an action mask needs Discrete actions, not {action_space}")
        observations.append(pb.TensorSpec(name=MASK, shape=[int(n)], dtype=pb.DataType.BOOL))
    return pb.ActionObservationSpecs(
        actions={1: tensor_spec(ACTION, action_space)},
        observations={uid: spec for uid, spec in enumerate(observations, 1)},
    )


# ---- dm_env_rpc -> gymnasium ----------------------------------------------------------------
def space_of(spec: pb.TensorSpec, action: bool) -> gym.Space:
    """The gymnasium space of one tensor spec (the module's table read backwards)."""
    what = f"{'action' if action else 'observation'} {spec.name!r}"
    if any(d < 0 for d in spec.shape):
        raise UnsupportedSpec(f"{what} has a variable dimension (shape {list(spec.shape)})")
    try:
        np_type = tensor_utils.data_type_to_np_type(spec.dtype)
    except TypeError as exc:
        raise UnsupportedSpec(f"{what}: {exc}") from exc
    shape = tuple(spec.shape)
    if np_type == np.bool_:
        return gym.spaces.Discrete(2) if not shape else gym.spaces.MultiBinary(list(shape))
    if not np.issubdtype(np_type, np.number):
        raise UnsupportedSpec(f"{what} has dtype {pb.DataType.Name(spec.dtype)}: not a number")
    low, high = _spec_bounds(spec, np_type)
    if np.issubdtype(np_type, np.integer) and (not shape or action):
        if low is None or high is None:
            raise UnsupportedSpec(f"{what}: an integer {'action' if action else ''} needs bounds")
        nvec = np.broadcast_to(np.asarray(high, np.int64) - low + 1, shape)
        start = np.broadcast_to(np.asarray(low, np.int64), shape)
        if not shape:
            return gym.spaces.Discrete(int(nvec), start=int(start))
        return gym.spaces.MultiDiscrete(nvec.copy(), start=start.copy())
    info = tensor_spec_utils.np_range_info(np_type)
    floating = np.issubdtype(np_type, np.floating)
    low = (-np.inf if floating else info.min) if low is None else low
    high = (np.inf if floating else info.max) if high is None else high
    return gym.spaces.Box(low, high, shape, np_type)


def _spec_bounds(spec: pb.TensorSpec, np_type: Any) -> tuple[Optional[Any], Optional[Any]]:
    """(min, max) where the spec sets them, None where it does not."""
    if spec.min.WhichOneof("payload") is None and spec.max.WhichOneof("payload") is None:
        return None, None
    try:
        bounds = tensor_spec_utils.bounds(spec)
    except ValueError as exc:
        raise UnsupportedSpec(f"{spec.name!r}: {exc}") from exc
    low = bounds.min if spec.min.WhichOneof("payload") else None
    high = bounds.max if spec.max.WhichOneof("payload") else None
    return low, high


# ---- tensors read and written by their spec -------------------------------------------------
def read_tensor(spec: pb.TensorSpec, tensor: pb.Tensor, check_bounds: bool) -> np.ndarray:
    """The array a tensor holds, as its spec says it must be: the spec's dtype exactly, its
    rank, one payload element broadcast to the whole shape, at most one -1 dimension (the
    rest of the payload), and, with `check_bounds`, within min/max. ValueError says what
    is wrong."""
    expected = tensor_utils.data_type_to_np_type(spec.dtype)
    got = tensor_utils.get_tensor_type(tensor) if tensor.WhichOneof("payload") else None
    if got != expected:
        raise ValueError(f"{spec.name!r} takes {expected} tensors, not {got}")
    flat = tensor_utils.unpack_proto(tensor)
    shape, want = list(tensor.shape), tuple(spec.shape)
    if len(shape) != len(want):
        raise ValueError(f"{spec.name!r} has shape {list(want)}, not {shape}")
    if shape.count(-1) > 1:
        raise ValueError(f"{spec.name!r}: shape {shape} has more than one variable dimension")
    if flat.size == 1 and want:
        value = np.full(want, flat[0], dtype=expected)
    else:
        try:
            value = flat.reshape(shape) if shape else flat.reshape(())
        except ValueError as exc:
            raise ValueError(f"{spec.name!r}: {flat.size} values for shape {shape}") from exc
    if value.shape != want:
        raise ValueError(f"{spec.name!r} has shape {list(want)}, not {list(value.shape)}")
    if check_bounds and np.issubdtype(expected, np.number):
        low, high = _spec_bounds(spec, expected)
        if (low is not None and np.any(value < low)) or (high is not None and np.any(value > high)):
            raise ValueError(f"{spec.name!r}: {value.tolist()} is outside [{low}, {high}]")
    return value


def write_tensor(spec: pb.TensorSpec, value: Any) -> pb.Tensor:
    """`value` as a tensor of the spec's dtype and shape."""
    array = np.asarray(value, dtype=tensor_utils.data_type_to_np_type(spec.dtype))
    if array.shape != tuple(spec.shape):
        array = array.reshape(tuple(spec.shape))
    return tensor_utils.pack_tensor(array)


def as_space_value(space: gym.Space, value: np.ndarray) -> Any:
    """A tensor's array as `space` holds its elements (Discrete: an int64 scalar;
    MultiBinary: int8, as gymnasium's)."""
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(value)
    return np.asarray(value, dtype=space.dtype)


@dataclass(frozen=True)
class ServerView:
    """What a dm_env_rpc server reads of its specs for one env: its action tensor, its
    observations by uid, and which observations are the agent's (the rest: reward, mask)."""

    specs: pb.ActionObservationSpecs

    @property
    def action_uid(self) -> int:
        (uid,) = self.specs.actions
        return uid

    def observation_uids(self) -> Mapping[str, int]:
        return {spec.name: uid for uid, spec in self.specs.observations.items()}
