"""A dm_env_rpc server's world as a gymnasium env: how the gym orchestrator makes its env
copies from ``env: {id: LABEL, dmEnvRpc: {address: HOST:PORT, ...}}`` (each copy creates a
world, with ``env.kwargs`` as CreateWorld's settings, joins it, and destroys it on close; or
joins ``dmEnvRpc.world``, an existing one).

The spaces come from the server's specs (`mistk_rl.bridges.dm_env_rpc_specs.space_of`):
the observation is the one observation tensor that is not ``reward``, ``discount`` or
``action_mask``, or a Dict of several; the reward is the ``reward`` observation (0 without
one); ``action_mask`` goes to ``info["action_mask"]``, where the orchestrator looks for
legal actions; the server must have exactly one action tensor. TERMINATED ends an
episode as terminated, INTERRUPTED as truncated. reset() sends Reset (with the seed as the
setting ``dmEnvRpc.seedSetting`` names, when it names one: dm_env_rpc has no standard seed)
and one Step that starts the sequence.

Every wait is bounded: connecting by ``connectTimeout``, each answer by ``timeout``; a server
that does not answer in time raises `DmEnvRpcTimeout` and the connection is dropped (the
env manager then restarts the copy, as for any env that hangs).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

import grpc
import gymnasium as gym
import numpy as np
from dm_env_rpc.v1 import dm_env_rpc_pb2 as pb
from dm_env_rpc.v1 import dm_env_rpc_pb2_grpc, message_utils, tensor_utils
from dm_env_rpc.v1.error import DmEnvRpcError

from mistk_rl.bridges.dm_env_rpc_specs import (
    MASK,
    RESERVED,
    REWARD,
    UnsupportedSpec,
    as_space_value,
    read_tensor,
    space_of,
    write_tensor,
)
from mistk_rl.sdk.schemas import DmEnvRpcSettings

GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
_CLOSED = object()  # the reader's last word: the stream ended


class DmEnvRpcUnavailable(ConnectionError):
    """No dm_env_rpc server answered, or its stream broke."""


class DmEnvRpcTimeout(TimeoutError):
    """The server took longer than the timeout to answer a request."""


class TimedConnection:
    """dm_env_rpc's Connection (`send` a request, get its response or a DmEnvRpcError), with
    every wait bounded: a thread reads the stream into a queue that `send` waits on."""

    def __init__(self, address: str, connect_timeout: float = 5.0, timeout: float = 30.0) -> None:
        self.address, self.timeout = address, timeout
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError as exc:
            self._channel.close()
            raise DmEnvRpcUnavailable(
                f"no dm_env_rpc server answered at {address} within {connect_timeout:g} s"
            ) from exc
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        stub = dm_env_rpc_pb2_grpc.EnvironmentStub(self._channel)
        self._call = stub.Process(iter(self._requests.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True, name="dm_env_rpc-reader")
        self._reader.start()
        self._closed = False

    def _read(self) -> None:
        try:
            for response in self._call:
                self._answers.put(response)
        except grpc.RpcError as exc:
            self._answers.put(exc)
        self._answers.put(_CLOSED)

    def send(self, request: message_utils.DmEnvRpcRequest) -> Any:
        if self._closed:
            raise DmEnvRpcUnavailable(f"the connection to {self.address} is closed")
        packed, field = message_utils.pack_environment_request(request)
        self._requests.put(packed)
        try:
            answer = self._answers.get(timeout=self.timeout)
        except queue.Empty:
            self.close()
            raise DmEnvRpcTimeout(
                f"{self.address} did not answer {field} within {self.timeout:g} s"
            ) from None
        if not isinstance(answer, pb.EnvironmentResponse):
            self.close()
            why = answer.details() if isinstance(answer, grpc.RpcError) else "the stream ended"
            raise DmEnvRpcUnavailable(f"{self.address} dropped the connection: {why}")
        return message_utils.unpack_environment_response(answer, field)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        self._call.cancel()
        self._channel.close()
        self._reader.join(timeout=5.0)


class DmEnvRpcEnv(gym.Env):
    """One world of a dm_env_rpc server (see the module)."""

    def __init__(self, settings: DmEnvRpcSettings, world_settings: Mapping[str, Any]) -> None:
        self.settings = settings
        self._connection: Optional[TimedConnection] = TimedConnection(
            settings.address, settings.connect_timeout, settings.timeout
        )
        self._world: Optional[str] = None  # the world this env created (and destroys)
        try:
            name = settings.world
            if name is None:
                name = self._world = self._create(world_settings)
            join = {k: tensor_utils.pack_tensor(v) for k, v in settings.join_settings.items()}
            specs = self._send(pb.JoinWorldRequest(world_name=name, settings=join))
            self._read_specs(specs.specs)
        except BaseException:
            self.close()
            raise

    def _send(self, request: Any) -> Any:
        if self._connection is None:
            raise DmEnvRpcUnavailable(f"this env's connection to {self.settings.address} is closed")
        return self._connection.send(request)

    def _create(self, world_settings: Mapping[str, Any]) -> str:
        settings = {k: tensor_utils.pack_tensor(v) for k, v in world_settings.items()}
        return self._send(pb.CreateWorldRequest(settings=settings)).world_name

    def _read_specs(self, specs: pb.ActionObservationSpecs) -> None:
        self._specs = specs
        if len(specs.actions) != 1:
            names = sorted(spec.name for spec in specs.actions.values())
            raise UnsupportedSpec(f"the server has {len(names)} action tensors {names}, not one")
        ((self._action_uid, self._action_spec),) = specs.actions.items()
        self.action_space = space_of(self._action_spec, action=True)
        by_name = {spec.name: uid for uid, spec in specs.observations.items()}
        own = {name: uid for name, uid in by_name.items() if name not in RESERVED}
        if not own:
            raise UnsupportedSpec(f"the server has no observation besides {sorted(by_name)}")
        spaces = {
            name: space_of(specs.observations[uid], action=False) for name, uid in own.items()
        }
        self._own = own
        self._reward, self._mask = by_name.get(REWARD), by_name.get(MASK)
        self.observation_space = (
            next(iter(spaces.values())) if len(spaces) == 1 else gym.spaces.Dict(spaces)
        )
        extra = [uid for uid in (self._reward, self._mask) if uid is not None]
        self._requested = sorted(own.values()) + extra

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        key = self.settings.seed_setting
        settings = {} if seed is None or key is None else {key: tensor_utils.pack_tensor(seed)}
        specs = self._send(pb.ResetRequest(settings=settings)).specs
        if specs != self._specs:
            raise RuntimeError(f"{self.settings.address} changed its specs on reset")
        response = self._send(pb.StepRequest(requested_observations=self._requested))
        if response.state != pb.EnvironmentStateType.RUNNING:
            state = pb.EnvironmentStateType.Name(response.state)
            raise RuntimeError(f"{self.settings.address}: a new sequence began {state}")
        obs, _, info = self._read(response.observations)
        return obs, info

    def step(self, action: Any):
        actions = {self._action_uid: write_tensor(self._action_spec, action)}
        response = self._send(
            pb.StepRequest(actions=actions, requested_observations=self._requested)
        )
        obs, reward, info = self._read(response.observations)
        terminated = response.state == pb.EnvironmentStateType.TERMINATED
        truncated = response.state == pb.EnvironmentStateType.INTERRUPTED
        return obs, reward, terminated, truncated, info

    def _read(self, tensors: Mapping[int, pb.Tensor]) -> tuple[Any, float, dict]:
        specs = self._specs.observations
        values = {
            name: self._value(specs[uid], tensors[uid], name) for name, uid in self._own.items()
        }
        obs: Union[Any, dict[str, Any]] = (
            next(iter(values.values())) if len(values) == 1 else values
        )
        reward = 0.0
        if self._reward is not None:
            reward = float(read_tensor(specs[self._reward], tensors[self._reward], False))
        info: dict[str, Any] = {}
        if self._mask is not None:
            mask = read_tensor(specs[self._mask], tensors[self._mask], False)
            info[MASK] = np.asarray(mask, dtype=np.int8)
        return obs, reward, info

    def _value(self, spec: pb.TensorSpec, tensor: pb.Tensor, name: str) -> Any:
        space = self.observation_space
        if isinstance(space, gym.spaces.Dict):
            space = space[name]
        return as_space_value(space, read_tensor(spec, tensor, check_bounds=False))

    def close(self) -> None:
        """Leave and destroy this env's world; a server already gone is no error here."""
        connection = getattr(self, "_connection", None)
        if connection is None:
            return
        try:
            connection.send(pb.LeaveWorldRequest())
            if self._world is not None:
                connection.send(pb.DestroyWorldRequest(world_name=self._world))
        except (DmEnvRpcError, DmEnvRpcUnavailable, DmEnvRpcTimeout, ValueError):
            pass
        finally:
            connection.close()
            self._connection = None


@dataclass(frozen=True)
class DmEnvRpcEnvFactory:
    """A picklable maker of one `DmEnvRpcEnv` (subprocess env workers need one): the
    ``dmEnvRpc`` settings as JSON sent them, and the world's settings."""

    settings: tuple  # (key, value) pairs of the camelCase dmEnvRpc object
    world_settings: tuple = ()

    def __call__(self) -> DmEnvRpcEnv:
        return DmEnvRpcEnv(
            DmEnvRpcSettings.model_validate(dict(self.settings)), dict(self.world_settings)
        )
