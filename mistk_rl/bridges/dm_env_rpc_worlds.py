"""The server side's state: worlds (one gymnasium env each) and what one connection does to
them, as dm_env_rpc's reference says (docs/v1/reference.md of google-deepmind/dm_env_rpc).

- CreateWorld's settings are the env's constructor kwargs (a tensor each; scalars and arrays
  become Python numbers and lists); a setting the env does not take fails CreateWorld.
  Worlds are named ``world-<n>``; any number may exist, up to `Worlds.limit`.
- A world has one agent: JoinWorld takes no settings and fails while another connection is
  joined. A world dies with the connection that created it (so env copies whose process
  died leave nothing behind), or by DestroyWorld, which fails from a connection joined to it.
- Reset and ResetWorld take one optional setting, ``seed`` (an integer): the next sequence
  starts with ``env.reset(seed=...)``. A step from a non-running state ignores its actions
  and starts the next sequence; a step in a running one needs the ``action`` tensor, of the
  spec's dtype and shape (a single element broadcasts), within its bounds.
- A sequence ends TERMINATED when the env terminates, INTERRUPTED when it is truncated.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Iterable, Mapping, Optional

import gymnasium as gym
import numpy as np
from dm_env_rpc.v1 import dm_env_rpc_pb2 as pb
from dm_env_rpc.v1 import tensor_utils
from google.rpc import code_pb2

from mistk_rl.bridges.dm_env_rpc_specs import (
    MASK,
    OBSERVATION,
    REWARD,
    as_space_value,
    env_specs,
    read_tensor,
    write_tensor,
)

EnvMaker = Callable[[dict[str, Any]], gym.Env]  # world settings (env kwargs) -> a new env
SEED = "seed"


class Refusal(Exception):
    """A request the server refuses: sent back as the answer's error status."""

    def __init__(self, message: str, code: int = code_pb2.INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


class World:
    """One env, its specs, and where its sequence is. Every use holds `lock` (a world is
    stepped by its agent's connection and reset by any)."""

    def __init__(self, name: str, env: gym.Env, creator: object) -> None:
        self.name, self.env, self.creator = name, env, creator
        self.lock = threading.Lock()
        self.agent: Optional[object] = None  # the connection joined to it
        self.alive = True
        self.running = False
        self._seed: Optional[int] = None
        obs, info = env.reset()  # (whether the env gives action masks decides the specs)
        self.specs = env_specs(env.observation_space, env.action_space, MASK in info)
        self._uids = {spec.name: uid for uid, spec in self.specs.observations.items()}
        self._values: dict[int, pb.Tensor] = {}
        self._observe(obs, 0.0, info)

    def interrupt(self, seed: Optional[int]) -> None:
        """End the sequence: the next step starts another (with `seed`, if given)."""
        self.running, self._seed = False, seed

    def step(self, actions: Mapping[int, pb.Tensor]) -> int:
        """One StepRequest's effect; returns the state to answer with."""
        if not self.running:
            obs, info = self.env.reset(seed=self._seed)
            self._seed, self.running = None, True
            self._observe(obs, 0.0, info)
            return pb.EnvironmentStateType.RUNNING
        action = self._action(actions)
        self.running = False  # (until the env has stepped: one that raised starts over)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._observe(obs, float(reward), info)
        self.running = not (terminated or truncated)
        if terminated:
            return pb.EnvironmentStateType.TERMINATED
        return pb.EnvironmentStateType.INTERRUPTED if truncated else pb.EnvironmentStateType.RUNNING

    def observations(self, uids: Iterable[int]) -> dict[int, pb.Tensor]:
        return {uid: self._values[uid] for uid in uids}

    def check_requested(self, uids: Iterable[int]) -> None:
        unknown = sorted(set(uids) - set(self.specs.observations))
        if unknown:
            raise Refusal(f"no observation has uid {', '.join(map(str, unknown))}")

    def _action(self, actions: Mapping[int, pb.Tensor]) -> Any:
        unknown = sorted(set(actions) - set(self.specs.actions))
        if unknown:
            raise Refusal(f"no action has uid {', '.join(map(str, unknown))}")
        ((uid, spec),) = self.specs.actions.items()
        if uid not in actions:
            raise Refusal(f"the step needs action {spec.name!r} (uid {uid})")
        try:
            value = read_tensor(spec, actions[uid], check_bounds=True)
        except (ValueError, TypeError) as exc:
            raise Refusal(f"action: {exc}") from exc
        return as_space_value(self.env.action_space, value)

    def _observe(self, obs: Any, reward: float, info: dict) -> None:
        """Pack what the env gave, once, for whichever observations are requested."""
        parts = obs if isinstance(obs, dict) else {OBSERVATION: obs}
        specs = self.specs.observations
        values = {
            self._uids[key]: write_tensor(specs[self._uids[key]], v) for key, v in parts.items()
        }
        values[self._uids[REWARD]] = tensor_utils.pack_tensor(reward, dtype=np.float64)
        if MASK in self._uids:
            n = int(getattr(self.env.action_space, "n", 0))
            mask = info.get(MASK, np.ones(n))
            values[self._uids[MASK]] = tensor_utils.pack_tensor(np.asarray(mask, dtype=bool))
        self._values = values


class Worlds:
    """Every world of a server, by name."""

    def __init__(self, make_env: EnvMaker, limit: int = 256) -> None:
        self._make, self.limit = make_env, limit
        self._worlds: dict[str, World] = {}
        self._lock = threading.Lock()
        self._names = itertools.count()

    def create(self, settings: Mapping[str, pb.Tensor], creator: object) -> World:
        with self._lock:
            if len(self._worlds) >= self.limit:
                raise Refusal(
                    f"this server holds {self.limit} worlds already", code_pb2.RESOURCE_EXHAUSTED
                )
        kwargs = {key: _python(tensor) for key, tensor in settings.items()}
        try:
            env = self._make(kwargs)
        except Exception as exc:  # (any constructor error: a bad setting)
            raise Refusal(f"no env with settings {kwargs}: {type(exc).__name__}: {exc}") from exc
        try:
            world = World(f"world-{next(self._names)}", env, creator)
        except Exception:
            env.close()
            raise
        with self._lock:
            self._worlds[world.name] = world
        return world

    def get(self, name: str) -> World:
        world = self._worlds.get(name)
        if world is None:
            raise Refusal(f"no world named {name!r}", code_pb2.NOT_FOUND)
        return world

    def destroy(self, world: World) -> None:
        with self._lock:
            self._worlds.pop(world.name, None)
        with world.lock:
            world.alive = False
            world.env.close()

    def created_by(self, creator: object) -> list[World]:
        with self._lock:
            return [w for w in self._worlds.values() if w.creator is creator]

    def close(self) -> None:
        with self._lock:
            worlds = list(self._worlds.values())
        for world in worlds:
            self.destroy(world)


def seed_setting(settings: Mapping[str, pb.Tensor]) -> Optional[int]:
    """Reset's and ResetWorld's one setting, ``seed``; any other is refused."""
    other = sorted(set(settings) - {SEED})
    if other:
        raise Refusal(f"unknown settings {other}: this server takes {SEED!r} only")
    if SEED not in settings:
        return None
    value = _python(settings[SEED])
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refusal(f"{SEED!r} must be an integer scalar, not {value!r}")
    return value


def _python(tensor: pb.Tensor) -> Any:
    """A setting's value as the env's constructor takes it."""
    try:
        value = tensor_utils.unpack_tensor(tensor)
    except (TypeError, ValueError) as exc:
        raise Refusal(f"a setting that is not a tensor of numbers or strings: {exc}") from exc
    return (
        value.tolist() if isinstance(value, np.ndarray) else getattr(value, "item", lambda: value)()
    )
