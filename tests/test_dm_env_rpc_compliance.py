"""dm_env_rpc's own compliance suite (`dm_env_rpc.v1.compliance`) against our server.

The suite is five absltest base classes, each abstract in what it needs (a connection, a
world, its specs, the settings it must refuse); a server's tests subclass them and supply
those, as dm_env_rpc's examples/catch_test.py does. Here every class runs against CartPole,
and the classes that read specs and step (JoinLeaveWorld, Step) also against each other kind
of env the server serves: Box actions (Pendulum), Dict observations of Discrete,
MultiDiscrete, MultiBinary and Box parts with MultiDiscrete or MultiBinary actions, a
tic-tac-toe seat against a random opponent (with its action mask), and the Thinker MDP.
pytest collects the generated ``Test*`` classes; each starts its server once.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import gymnasium as gym
import numpy as np
from dm_env_rpc.v1 import compliance, tensor_spec_utils, tensor_utils
from dm_env_rpc.v1 import dm_env_rpc_pb2 as pb
from gymnasium import spaces

from mistk_rl.bridges.dm_env_rpc_client import TimedConnection
from mistk_rl.bridges.dm_env_rpc_server import DmEnvRpcServer, EnvSource, serve


class Gadgets(gym.Env):
    """Every space kind the server carries: a Dict observation of Discrete, MultiDiscrete,
    MultiBinary and Box parts, and MultiDiscrete (or, with ``binary``, MultiBinary) actions;
    the reward is how many action elements equal the observed ``target``."""

    def __init__(self, binary: bool = False) -> None:
        self.observation_space = spaces.Dict(
            {
                "level": spaces.Discrete(3, start=1),
                "target": spaces.MultiDiscrete([2, 3, 4]) if not binary else spaces.MultiBinary(3),
                "lights": spaces.MultiBinary([2, 2]),
                "where": spaces.Box(-1.0, 1.0, (2,), np.float64),
            }
        )
        self.action_space = spaces.MultiBinary(3) if binary else spaces.MultiDiscrete([2, 3, 4])

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:  # (observations are samples of the space, seeded with the env)
            self.observation_space.seed(seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action: Any):
        assert self.action_space.contains(action), action
        reward = float(np.sum(np.asarray(action) == self._obs["target"]))
        self.t += 1
        return self._observe(), reward, self.t >= 5, False, {}

    def _observe(self) -> dict[str, Any]:
        self._obs = self.observation_space.sample()
        return self._obs


for _id, _kwargs in (("Gadgets-v0", {}), ("GadgetsBinary-v0", {"binary": True})):
    if _id not in gym.registry:
        gym.register(_id, entry_point=Gadgets, kwargs=_kwargs)

THINKER = {"wrapper_type": 2, "rec_t": 3, "max_depth": 2, "train_model": False}
SOURCES = {
    "CartPole": EnvSource("CartPole-v1"),
    "Pendulum": EnvSource("Pendulum-v1"),
    "Gadgets": EnvSource("Gadgets-v0"),
    "GadgetsBinary": EnvSource("GadgetsBinary-v0"),
    "TicTacToeSeat": EnvSource("classic/tictactoe-v3", opponent="random", seat="player_2"),
    "Thinker": EnvSource("mistk_rl.thinker.puzzle:MistkPuzzle-v0", thinker=THINKER),
}


def valid_tensor(spec: pb.TensorSpec) -> pb.Tensor:
    """An action the spec allows: its minimum (bools: False)."""
    np_type = tensor_utils.data_type_to_np_type(spec.dtype)
    if np_type == np.bool_:
        return tensor_utils.pack_tensor(np.zeros(tuple(spec.shape), bool))
    low = tensor_spec_utils.bounds(spec).min
    return tensor_utils.pack_tensor(np.broadcast_to(low, tuple(spec.shape)).astype(np_type))


class ServedWorld:
    """What every compliance class asks for, from one server per class: a connection and a
    world created on it for each test (Step: joined, with its specs), and the settings our
    server refuses."""

    source: ClassVar[EnvSource]
    join_in_setup: ClassVar[bool] = False
    server: ClassVar[DmEnvRpcServer]
    _connection: TimedConnection
    _world: str
    _specs: Optional[pb.ActionObservationSpecs]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()  # type: ignore[misc]
        cls.server = serve(cls.source)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
        super().tearDownClass()  # type: ignore[misc]

    def setUp(self) -> None:
        self._connection = TimedConnection(self.server.address, 10.0, 60.0)
        self._world = self._connection.send(pb.CreateWorldRequest()).world_name
        self._specs = self.join_world() if self.join_in_setup else None
        super().setUp()  # type: ignore[misc]

    def tearDown(self) -> None:
        super().tearDown()  # type: ignore[misc]
        try:
            self._connection.send(pb.LeaveWorldRequest())
            self._connection.send(pb.DestroyWorldRequest(world_name=self._world))
        finally:
            self._connection.close()

    @property
    def connection(self) -> TimedConnection:
        return self._connection

    @property
    def world_name(self) -> str:
        return self._world

    def join_world(self, **request: Any) -> pb.ActionObservationSpecs:
        """Join this test's world (JoinLeaveWorld names the world and settings itself)."""
        request = request or {"world_name": self._world}
        return self._connection.send(pb.JoinWorldRequest(**request)).specs

    @property
    def specs(self) -> Optional[pb.ActionObservationSpecs]:
        return self._specs

    @property
    def required_actions(self) -> dict[int, pb.Tensor]:
        assert self._specs is not None
        return {uid: valid_tensor(spec) for uid, spec in self._specs.actions.items()}

    # CreateDestroyWorld: worlds need no settings; one the env does not take is refused
    required_world_settings: dict[str, pb.Tensor] = {}
    invalid_world_settings = {"no_such_kwarg": tensor_utils.pack_tensor(1)}
    has_multiple_world_support = True
    # JoinLeaveWorld: a world is joined without settings; any is refused
    invalid_join_settings = {"team": tensor_utils.pack_tensor("red")}


def _generate(name: str, source: EnvSource, bases: tuple[type, ...]) -> None:
    for base in bases:
        attrs = {"source": source, "join_in_setup": base is compliance.Step}
        cls = type(f"Test{base.__name__}{name}", (ServedWorld, base), attrs)
        globals()[cls.__name__] = cls


ALL = (
    compliance.CreateDestroyWorld,
    compliance.JoinLeaveWorld,
    compliance.Reset,
    compliance.ResetWorld,
    compliance.Step,
)
for _name, _source in SOURCES.items():
    _generate(
        _name, _source, ALL if _name == "CartPole" else (compliance.JoinLeaveWorld, compliance.Step)
    )
