"""A dm_env_rpc server as the gym orchestrator's env source (`DmEnvRpcEnv`), checked against
a server that is not ours: `HelperServer`, written with dm_env_rpc's own helpers
(SpecManager packs and unpacks by name, tensor_spec_utils sets bounds) around a gymnasium
env, as dm_env_rpc's examples/catch_environment.py is, with names, uids and dtypes of its own
(float64 ``state``, int32 ``push``, uids from 10, a Reset setting ``rng_seed``). And our
server -> our client, which must replay the env in process exactly."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent import futures
from typing import Any, Iterator

import grpc
import gymnasium as gym
import numpy as np
import pytest
from dm_env_rpc.v1 import dm_env_rpc_pb2 as pb
from dm_env_rpc.v1 import dm_env_rpc_pb2_grpc, spec_manager, tensor_spec_utils, tensor_utils
from dm_env_rpc.v1.error import DmEnvRpcError
from google.rpc import code_pb2, status_pb2
from gymnasium.utils.env_checker import check_env

from mistk_rl.bridges.dm_env_rpc_client import (
    DmEnvRpcEnv,
    DmEnvRpcTimeout,
    DmEnvRpcUnavailable,
    TimedConnection,
)
from mistk_rl.bridges.dm_env_rpc_server import EnvSource, serve
from mistk_rl.bridges.dm_env_rpc_specs import UnsupportedSpec
from mistk_rl.sdk.client import ServiceError
from mistk_rl.sdk.schemas import DmEnvRpcSettings
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT
from tests.test_dm_env_rpc_compliance import Gadgets  # noqa: F401  (registers Gadgets-v0)


class HelperServer(dm_env_rpc_pb2_grpc.EnvironmentServicer):
    """Worlds of one gymnasium env each (a Box observation, Discrete actions); with
    `with_text`, an extra string observation no gymnasium space carries."""

    def __init__(self, env_id: str, with_text: bool = False) -> None:
        self.env_id = env_id
        probe = gym.make(env_id)
        state = pb.TensorSpec(name="state", shape=probe.observation_space.shape, dtype=pb.DOUBLE)
        push = pb.TensorSpec(name="push", dtype=pb.INT32)
        tensor_spec_utils.set_bounds(push, 0, int(probe.action_space.n) - 1)
        probe.close()
        observations = {10: state, 11: pb.TensorSpec(name="reward", dtype=pb.DOUBLE)}
        if with_text:
            observations[12] = pb.TensorSpec(name="caption", dtype=pb.STRING)
        self.specs = pb.ActionObservationSpecs(actions={20: push}, observations=observations)
        self.observations = spec_manager.SpecManager(self.specs.observations)
        self.actions = spec_manager.SpecManager(self.specs.actions)
        self.worlds: dict[str, gym.Env] = {}
        self.lock = threading.Lock()

    def Process(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:  # noqa: N802
        joined: dict[str, Any] = {}  # this connection's: world, seed, last observation, running
        for request in request_iterator:
            kind = request.WhichOneof("payload")
            try:
                answer = getattr(self, kind)(joined, getattr(request, kind))
                yield pb.EnvironmentResponse(**{kind: answer})
            except Exception as exc:  # noqa: BLE001
                yield pb.EnvironmentResponse(
                    error=status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(exc))
                )

    def create_world(self, joined: dict, request: Any) -> Any:
        with self.lock:
            name = f"gym{len(self.worlds)}"
            self.worlds[name] = gym.make(self.env_id)
        return pb.CreateWorldResponse(world_name=name)

    def join_world(self, joined: dict, request: Any) -> Any:
        joined.update(env=self.worlds[request.world_name], running=False, seed=None)
        return pb.JoinWorldResponse(specs=self.specs)

    def reset(self, joined: dict, request: Any) -> Any:
        settings = {key: tensor_utils.unpack_tensor(t) for key, t in request.settings.items()}
        joined.update(running=False, seed=settings.get("rng_seed"))
        return pb.ResetResponse(specs=self.specs)

    def step(self, joined: dict, request: Any) -> Any:
        env, state = joined["env"], pb.EnvironmentStateType.RUNNING
        if not joined["running"]:
            seed = joined["seed"]
            obs, _ = env.reset(seed=None if seed is None else int(seed))
            reward, joined["running"], joined["seed"] = 0.0, True, None
        else:
            action = self.actions.unpack(request.actions)["push"]
            obs, reward, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                joined["running"] = False
                state = pb.TERMINATED if terminated else pb.INTERRUPTED
        values = {"state": np.asarray(obs, np.float64), "reward": float(reward), "caption": "hi"}
        names = [self.observations.uid_to_name(uid) for uid in request.requested_observations]
        packed = self.observations.pack({name: values[name] for name in names})
        return pb.StepResponse(state=state, observations=packed)

    def leave_world(self, joined: dict, request: Any) -> Any:
        joined.clear()
        return pb.LeaveWorldResponse()

    def destroy_world(self, joined: dict, request: Any) -> Any:
        with self.lock:
            self.worlds.pop(request.world_name).close()
        return pb.DestroyWorldResponse()


def _start(servicer: Any) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    dm_env_rpc_pb2_grpc.add_EnvironmentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def helper_server():
    """(servicer, address) of a HelperServer of CartPole-v1, stopped at teardown."""
    servicer = HelperServer("CartPole-v1")
    server, address = _start(servicer)
    yield servicer, address
    server.stop(None).wait(10)


@pytest.fixture
def our_server():
    """Starts our server of an EnvSource; every one started is stopped at teardown."""
    started = []

    def _serve(source: EnvSource) -> str:
        started.append(serve(source))
        return started[-1].address

    yield _serve
    for server in started:
        server.stop()


def _env(address: str, **settings: Any) -> DmEnvRpcEnv:
    return DmEnvRpcEnv(DmEnvRpcSettings(address=address, **settings), {})


def _rollout(env: gym.Env, seed: int, actions: list[Any]) -> list[tuple]:
    """(observation, reward, terminated, truncated, mask) of each step, resets included."""
    obs, info = env.reset(seed=seed)
    out: list[tuple] = [(obs, 0.0, False, False, info.get("action_mask"))]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, info.get("action_mask")))
        if terminated or truncated:
            obs, info = env.reset()
            out.append((obs, 0.0, False, False, info.get("action_mask")))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return (a is None and b is None) or (
        np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)
    )


# ---- against dm_env_rpc's own helpers --------------------------------------------------------
def test_a_helper_server_plays_as_cartpole_in_process(helper_server):
    servicer, address = helper_server
    env = _env(address, seed_setting="rng_seed")
    try:
        assert env.action_space == gym.spaces.Discrete(2)
        assert env.observation_space.shape == (4,) and env.observation_space.dtype == np.float64
        actions = [int(a) for a in np.random.default_rng(0).integers(0, 2, 60)]
        remote = _rollout(env, 5, actions)
        local = _rollout(gym.make("CartPole-v1"), 5, actions)
        assert len(remote) == len(local) and any(step[2] for step in local)  # an episode ended
        for (o1, r1, t1, u1, _), (o2, r2, t2, u2, _) in zip(remote, local):
            assert np.allclose(o1, o2) and (r1, t1, u1) == (r2, t2, u2)
    finally:
        env.close()
    assert servicer.worlds == {}  # close() destroyed the world it created


def test_an_unsupported_spec_is_refused_naming_the_tensor():
    server, address = _start(HelperServer("CartPole-v1", with_text=True))
    try:
        with pytest.raises(UnsupportedSpec, match="'caption'.*STRING"):
            _env(address)
    finally:
        server.stop(None).wait(10)


def test_an_address_nobody_answers_at_fails_within_the_connect_timeout():
    with pytest.raises(DmEnvRpcUnavailable, match="127.0.0.1:9 within 0.5 s"):
        TimedConnection("127.0.0.1:9", connect_timeout=0.5)


def test_a_server_that_never_answers_times_out_and_drops_the_connection():
    release = threading.Event()

    class Silent(dm_env_rpc_pb2_grpc.EnvironmentServicer):
        def Process(self, request_iterator, context):  # noqa: N802
            next(request_iterator)
            release.wait(30)
            return iter(())

    server, address = _start(Silent())
    try:
        connection = TimedConnection(address, timeout=0.5)
        with pytest.raises(DmEnvRpcTimeout, match="create_world within 0.5 s"):
            connection.send(pb.CreateWorldRequest())
        with pytest.raises(DmEnvRpcUnavailable, match="closed"):
            connection.send(pb.CreateWorldRequest())
    finally:
        release.set()
        server.stop(None).wait(10)


# ---- our server -> our client ----------------------------------------------------------------
@pytest.mark.parametrize(
    "source, actions",
    [
        (EnvSource("CartPole-v1"), [0, 1] * 5 + [0] * 30),
        (EnvSource("Gadgets-v0"), [np.array([1, 2, 3])] * 12),
        (EnvSource("Pendulum-v1", kwargs={"max_episode_steps": 4}), [np.array([0.5], "f")] * 9),
    ],
)
def test_our_server_replays_the_env_in_process(our_server, source, actions):
    env = _env(our_server(source), seed_setting="seed")
    try:
        remote, local = _rollout(env, 3, actions), _rollout(source({}), 3, actions)
        assert len(remote) == len(local)
        for a, b in zip(remote, local):
            assert _same(a[0], b[0]) and a[1:4] == b[1:4]
    finally:
        env.close()


def test_a_game_seat_comes_with_its_action_mask(our_server):
    source = EnvSource("classic/tictactoe-v3", opponent="random", seat="player_2")
    env = _env(our_server(source), seed_setting="seed")
    try:
        assert env.action_space == gym.spaces.Discrete(9)
        obs, info = env.reset(seed=1)
        assert obs.shape == (3, 3, 2) and info["action_mask"].sum() == 8  # one cell taken
        first = int(np.flatnonzero(info["action_mask"])[0])
        assert _same(_rollout(env, 1, [first])[1][4], _rollout(source({}), 1, [first])[1][4])
    finally:
        env.close()


def test_spaces_come_back_from_the_specs(our_server):
    env = _env(our_server(EnvSource("Gadgets-v0")))
    try:
        obs = env.observation_space
        assert obs["level"] == gym.spaces.Discrete(3, start=1)
        assert obs["lights"] == gym.spaces.MultiBinary([2, 2])
        assert obs["where"] == gym.spaces.Box(-1.0, 1.0, (2,), np.float64)
        # an integer array observation is a Box (images are): bounds kept
        assert obs["target"] == gym.spaces.Box(0, np.array([1, 2, 3]), (3,), np.int64)
        assert env.action_space == gym.spaces.MultiDiscrete([2, 3, 4])
    finally:
        env.close()


def test_gymnasium_check_env_passes_over_the_bridge(our_server):
    for source in (EnvSource("CartPole-v1"), EnvSource("GadgetsBinary-v0")):
        env = _env(our_server(source), seed_setting="seed")
        try:
            check_env(env, skip_render_check=True)
        finally:
            env.close()


def test_a_world_dies_with_the_connection_that_created_it(our_server):
    address = our_server(EnvSource("CartPole-v1"))
    first = TimedConnection(address)
    world = first.send(pb.CreateWorldRequest()).world_name
    first.close()
    second = TimedConnection(address)
    try:
        deadline = time.monotonic() + 10  # (the server hears of the stream's end on its own)
        while True:
            try:
                second.send(pb.JoinWorldRequest(world_name=world))
            except DmEnvRpcError as exc:
                assert "no world named" in exc.message
                break
            second.send(pb.LeaveWorldRequest())
            assert time.monotonic() < deadline, "the world outlived its creator"
            threading.Event().wait(0.05)
    finally:
        second.close()


# ---- the gym orchestrator's env source --------------------------------------------------------
def _orchestrator(launch, env: dict) -> Any:
    orch_service = launch("orchestrator", GYM_ORCHESTRATOR)
    agent_service = launch("agent", RANDOM_AGENT)
    orch, agent = orch_service.client(), agent_service.client()
    orch.initialize(env)
    agent.initialize(hyperparameters={"seed": 0})
    agent.build_model()
    orch.register_agent("player", agent_service.url)
    return orch


@pytest.mark.parametrize("manager", ["base", "subprocess"])
def test_the_gym_orchestrator_plays_a_helper_servers_worlds(launch, helper_server, manager):
    servicer, address = helper_server
    env = {"id": "cartpole-remote", "dmEnvRpc": {"address": address, "seedSetting": "rng_seed"}}
    orch = _orchestrator(launch, env)
    config = {"numEpisodes": 6, "numEnvs": 3, "seed": 0, "envManager": manager}
    orch.start_episode(config, wait=True, timeout=120)
    episodes = orch.get_results().episodes
    assert len(episodes) == 6 and all(e.length >= 8 for e in episodes)
    assert len(servicer.worlds) == 3  # one world per env copy, kept for the next run
    orch.terminate()
    deadline = time.monotonic() + 30
    while servicer.worlds and time.monotonic() < deadline:
        threading.Event().wait(0.1)
    assert servicer.worlds == {}  # terminate closed the copies, which destroyed their worlds


def _post_initialize(service: Any, env: dict) -> tuple[int, dict]:
    """initialize as raw JSON (the SDK's own models would refuse malformed settings first)."""
    request = urllib.request.Request(
        f"{service.url}/v1/mistk/orchestrator/initialize",
        data=json.dumps({"env": env}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    "dm_env_rpc, match",
    [
        ({"address": "127.0.0.1:9", "connectTimeout": 0.5}, "no dm_env_rpc server answered"),
        ({"address": "not an address"}, "address"),
        ({"address": "127.0.0.1:9", "worldName": "x"}, "worldName"),
    ],
)
def test_bad_dm_env_rpc_settings_are_a_400_at_initialize(launch, dm_env_rpc, match):
    service = launch("orchestrator", GYM_ORCHESTRATOR)
    status, problem = _post_initialize(service, {"id": "remote", "dmEnvRpc": dm_env_rpc})
    assert status == 400 and match in json.dumps(problem), problem
    assert service.client().status().state == "uninitialized"  # (unchanged)


def test_unsupported_specs_and_thinker_are_a_400_at_initialize(launch):
    server, address = _start(HelperServer("CartPole-v1", with_text=True))
    try:
        orch = launch("orchestrator", GYM_ORCHESTRATOR).client()
        with pytest.raises(ServiceError, match="'caption'") as caught:
            orch.initialize({"id": "remote", "dmEnvRpc": {"address": address}})
        assert caught.value.status == 400
        with pytest.raises(ServiceError, match="thinker or dmEnvRpc"):
            orch.initialize(
                {"id": "remote", "dmEnvRpc": {"address": address}, "thinker": {"rec_t": 3}}
            )
    finally:
        server.stop(None).wait(10)
