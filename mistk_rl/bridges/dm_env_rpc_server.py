"""An orchestrator's envs served over DeepMind's dm_env_rpc (gRPC): any gymnasium id, a
PettingZoo game seat against a fixed opponent, or the Thinker MDP over an env.

    server = serve(EnvSource("CartPole-v1"), "127.0.0.1:0")   # port 0: any free one
    ...  # dm_env_rpc clients connect to server.address
    server.stop()

or from a shell, ``mistk-rl serve dm-env-rpc --env CartPole-v1 --port 50151`` (`main`).
What each request does is `mistk_rl.bridges.dm_env_rpc_worlds`'s; the tensors are
`mistk_rl.bridges.dm_env_rpc_specs`'. It passes dm_env_rpc's own compliance suite
(tests/test_dm_env_rpc_compliance.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import grpc
import gymnasium as gym
from dm_env_rpc.v1 import dm_env_rpc_pb2 as pb
from dm_env_rpc.v1 import dm_env_rpc_pb2_grpc
from google.rpc import code_pb2, status_pb2

from mistk_rl.bridges.dm_env_rpc_seat import SeatEnv
from mistk_rl.bridges.dm_env_rpc_specs import env_specs
from mistk_rl.bridges.dm_env_rpc_worlds import EnvMaker, Refusal, World, Worlds, seed_setting
from mistk_rl.rl.envs import make_env_fns
from mistk_rl.thinker.gym_env import ThinkerEnvFactory

GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


@dataclass(frozen=True)
class EnvSource:
    """What each world's env is: a gymnasium id (with `thinker`: the Thinker MDP over it,
    mistk_rl.thinker.config's settings plus ``actions``), or with `opponent` a PettingZoo
    game's `seat` (default: the first) against that opponent. `kwargs` are every world's
    env kwargs, under which CreateWorld's settings go."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    thinker: Optional[dict[str, Any]] = None
    opponent: Optional[str] = None
    seat: Optional[str] = None

    def __call__(self, settings: dict[str, Any]) -> gym.Env:
        kwargs = {**self.kwargs, **settings}
        if self.opponent is not None:
            return SeatEnv(self.env_id, self.opponent, self.seat, kwargs)
        if self.thinker is not None:
            thinker = dict(self.thinker)
            actions = thinker.pop("actions", "Discrete")
            return ThinkerEnvFactory(
                self.env_id, tuple(sorted(kwargs.items())), tuple(sorted(thinker.items())), actions
            )()
        return make_env_fns(self.env_id, kwargs, 1)[0]()


class Connection:
    """One client's stream: the world it is joined to, and the requests' effects."""

    def __init__(self, worlds: Worlds) -> None:
        self.worlds = worlds
        self.world: Optional[World] = None
        self._handlers: dict[str, Callable[[Any], Any]] = {
            "create_world": self.create_world,
            "join_world": self.join_world,
            "step": self.step,
            "reset": self.reset,
            "reset_world": self.reset_world,
            "leave_world": self.leave_world,
            "destroy_world": self.destroy_world,
        }

    def answer(self, request: pb.EnvironmentRequest) -> pb.EnvironmentResponse:
        kind = request.WhichOneof("payload")
        handler = self._handlers.get(kind or "")
        try:
            if handler is None:
                raise Refusal(f"this server does not take {kind} requests", code_pb2.UNIMPLEMENTED)
            return pb.EnvironmentResponse(**{kind: handler(getattr(request, kind))})
        except Refusal as exc:
            return _error(exc.code, str(exc))
        except Exception as exc:  # noqa: BLE001  (the env failed: the client hears why)
            return _error(code_pb2.INTERNAL, f"{kind}: {type(exc).__name__}: {exc}")

    def create_world(self, request: pb.CreateWorldRequest) -> pb.CreateWorldResponse:
        world = self.worlds.create(request.settings, creator=self)
        return pb.CreateWorldResponse(world_name=world.name)

    def join_world(self, request: pb.JoinWorldRequest) -> pb.JoinWorldResponse:
        if self.world is not None:
            raise Refusal(f"joined to {self.world.name!r} already", code_pb2.FAILED_PRECONDITION)
        if request.settings:
            raise Refusal(f"JoinWorld takes no settings, not {sorted(request.settings)}")
        world = self.worlds.get(request.world_name)
        with world.lock:
            if world.agent is not None:
                raise Refusal(f"{world.name!r} has its agent already", code_pb2.FAILED_PRECONDITION)
            world.agent, world.running = self, False
        self.world = world
        return pb.JoinWorldResponse(specs=world.specs)

    def step(self, request: pb.StepRequest) -> pb.StepResponse:
        world = self._joined()
        with world.lock:
            self._check_alive(world)
            world.check_requested(request.requested_observations)
            state = world.step(request.actions)
            return pb.StepResponse(
                state=state, observations=world.observations(request.requested_observations)
            )

    def reset(self, request: pb.ResetRequest) -> pb.ResetResponse:
        world, seed = self._joined(), seed_setting(request.settings)
        with world.lock:
            self._check_alive(world)
            world.interrupt(seed)
        return pb.ResetResponse(specs=world.specs)

    def reset_world(self, request: pb.ResetWorldRequest) -> pb.ResetWorldResponse:
        world, seed = self.worlds.get(request.world_name), seed_setting(request.settings)
        with world.lock:
            world.interrupt(seed)
        return pb.ResetWorldResponse()

    def leave_world(self, request: Optional[pb.LeaveWorldRequest] = None) -> pb.LeaveWorldResponse:
        world, self.world = self.world, None
        if world is not None:
            with world.lock:
                world.agent = None
        return pb.LeaveWorldResponse()

    def destroy_world(self, request: pb.DestroyWorldRequest) -> pb.DestroyWorldResponse:
        world = self.worlds.get(request.world_name)
        if world is self.world:
            raise Refusal("leave the world before destroying it", code_pb2.FAILED_PRECONDITION)
        if world.agent is not None:
            raise Refusal(f"{world.name!r} has an agent joined", code_pb2.FAILED_PRECONDITION)
        self.worlds.destroy(world)
        return pb.DestroyWorldResponse()

    def close(self) -> None:
        """The stream ended: leave, and destroy the worlds this connection created."""
        self.leave_world()
        for world in self.worlds.created_by(self):
            self.worlds.destroy(world)

    def _joined(self) -> World:
        if self.world is None:
            raise Refusal("join a world first", code_pb2.FAILED_PRECONDITION)
        return self.world

    @staticmethod
    def _check_alive(world: World) -> None:
        if not world.alive:
            raise Refusal(f"{world.name!r} was destroyed", code_pb2.FAILED_PRECONDITION)


def _error(code: int, message: str) -> pb.EnvironmentResponse:
    return pb.EnvironmentResponse(error=status_pb2.Status(code=code, message=message))


class _Servicer(dm_env_rpc_pb2_grpc.EnvironmentServicer):
    def __init__(self, worlds: Worlds) -> None:
        self.worlds = worlds

    def Process(  # noqa: N802  (gRPC's name)
        self, request_iterator: Iterator[pb.EnvironmentRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.EnvironmentResponse]:
        connection = Connection(self.worlds)
        try:
            for request in request_iterator:
                yield connection.answer(request)
        finally:
            connection.close()


@dataclass
class DmEnvRpcServer:
    """A running server: where it listens; `stop` ends its streams and closes every env."""

    address: str
    server: grpc.Server
    worlds: Worlds

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace).wait(timeout=grace + 10)
        self.worlds.close()

    def __enter__(self) -> "DmEnvRpcServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    make_env: EnvMaker, address: str = "127.0.0.1:0", max_connections: int = 64
) -> DmEnvRpcServer:
    """Start serving worlds of `make_env`'s envs at `address` (``host:port``; port 0: any
    free one, `DmEnvRpcServer.address` says which). Each connection holds one of
    `max_connections` threads while it is open; one more is refused at once
    (RESOURCE_EXHAUSTED), not queued. An env whose spaces have no tensor specs is refused
    here (`UnsupportedSpec`), before anything listens."""
    probe = make_env({})
    try:
        _, info = probe.reset()
        env_specs(probe.observation_space, probe.action_space, "action_mask" in info)
    finally:
        probe.close()
    worlds = Worlds(make_env)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="dm_env_rpc"),
        maximum_concurrent_rpcs=max_connections,
        options=GRPC_OPTIONS,
    )
    dm_env_rpc_pb2_grpc.add_EnvironmentServicer_to_server(_Servicer(worlds), server)
    host, _, _ = address.rpartition(":")
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot listen at {address}: {exc}") from exc
    if port == 0:
        raise OSError(f"cannot listen at {address}")
    server.start()
    return DmEnvRpcServer(f"{host}:{port}", server, worlds)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``mistk-rl serve dm-env-rpc``: serve until SIGINT or SIGTERM."""
    args = _parser().parse_args(argv)
    source = EnvSource(args.env, args.kwargs, args.thinker, args.opponent, args.seat)
    try:
        server = serve(source, f"{args.host}:{args.port}", args.max_connections)
    except Exception as exc:  # noqa: BLE001  (any reason the env cannot be served: said, exit 2)
        print(f"cannot serve {args.env}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    print(f"serving {args.env} over dm_env_rpc at {server.address}", flush=True)
    while not stopping.wait(1.0):
        pass
    server.stop()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mistk-rl serve dm-env-rpc",
        description="Serve an env over dm_env_rpc (gRPC): each world a new env copy.",
    )
    parser.add_argument("--env", required=True, help="a gymnasium id, or a PettingZoo game's")
    parser.add_argument("--port", type=int, default=0, help="0 (default): any free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--kwargs", type=json.loads, default={}, help="JSON: every world's env kwargs"
    )
    parser.add_argument(
        "--thinker", type=json.loads, default=None, help="JSON: serve the Thinker MDP over --env"
    )
    parser.add_argument("--opponent", help="serve a seat of game --env against this opponent")
    parser.add_argument("--seat", help="with --opponent: the seat (default: the first)")
    parser.add_argument("--max-connections", type=int, default=64)
    return parser


if __name__ == "__main__":
    sys.exit(main())
