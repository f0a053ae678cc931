"""Step-path benchmarks (`mistk-rl bench transport` and `mistk-rl bench envs`).

transport: env steps per second on CartPole-v1 with the random agent, driving the gym
orchestrator's loop (ready observations -> one step request carrying the last steps'
outcomes -> env manager step, through `mistk_rl.sdk.stepping`) with the agent called in-process
(its service object, no HTTP) and over HTTP (a real gunicorn service on loopback; stepColumns
as JSON and binary, and the entity-keyed step), at each env count, in one run.
Over HTTP it also counts the bytes on the wire per env step (requests and answers, heads
included) against the raw bytes of what an env step must carry: the observation, a float32
reward and the two flags (`RAW_STEP_BYTES`). CartPole's reward is always 1, which the binary
encoding sends once per request (a fill); `http-binary-varied` and `stream-varied` are the
binary step and the stream on a CartPole whose rewards differ from step to step
(`VariedRewardCartPole-v0`), the bytes a dense, varying reward costs.

envs: env steps per second of each env manager and of gymnasium's SyncVectorEnv and
AsyncVectorEnv at the same env counts, with constant actions, on CartPole-v1 and on a
CartPole whose step costs 1 ms (`SlowCartPole-v0`, registered here).
"""

from __future__ import annotations

import tempfile
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from mistk_rl.rl.envs import MANAGERS, BaseEnvManager, EnvManager, make_env_fns
from mistk_rl.sdk.client import AgentClient
from mistk_rl.sdk.stepping import StepOutcome, Stepper, stepper_for
from mistk_rl.spaces import space_to_dict
from mistk_rl.wire.jsonable import to_jsonable

SLOW_ENV = "harness.bench.step:SlowCartPole-v0"


class SlowCartPole(gym.Wrapper):
    """CartPole whose step takes `delay` seconds: an env with real per-step cost."""

    def __init__(self, delay: float = 0.001) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return self.env.step(action)


class VariedRewardCartPole(gym.Wrapper):
    """CartPole whose reward varies from step to step (1 plus seeded noise), so that no
    request's rewards are all the same: what the wire carries for a dense reward."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.noise = np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:  # (each env copy its own noise: copies get seed, seed + 1, ...)
            self.noise = np.random.default_rng(seed)
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward + float(self.noise.normal(0, 0.1)), terminated, truncated, info


if "SlowCartPole-v0" not in gym.registry:
    # (gymnasium types an entry point as taking any keyword: a class taking its own works)
    gym.register("SlowCartPole-v0", entry_point=SlowCartPole)  # type: ignore[arg-type]
if "VariedRewardCartPole-v0" not in gym.registry:
    gym.register(
        "VariedRewardCartPole-v0",
        entry_point=VariedRewardCartPole,  # type: ignore[arg-type]
    )
VARIED_ENV = "harness.bench.step:VariedRewardCartPole-v0"


# CartPole-v1's observation (4 float32), a float32 reward, terminated and truncated (1 byte
# each); no action mask
RAW_STEP_BYTES = 4 * 4 + 4 + 2


def _drive(stepper: Stepper, manager: EnvManager, steps: int) -> tuple[int, float]:
    """Run the orchestrator's step loop (`orchestrators.gym_orchestrator`: ready copies act,
    the last steps' outcomes ride along) for at least `steps` env steps; (steps, seconds)."""
    outcomes: dict[int, StepOutcome] = {}
    done_steps, started = 0, time.perf_counter()
    while done_steps < steps:
        actions = stepper.step(manager.ready_obs, outcomes)
        timesteps = manager.step({i: int(a) for i, a in actions.items()})
        outcomes = {
            i: StepOutcome(ts.obs, ts.reward, ts.terminated, ts.truncated)
            for i, ts in timesteps.items()
        }
        done_steps += len(timesteps)
    stepper.step({}, outcomes)
    return done_steps, time.perf_counter() - started


def measure_steps(
    agent: AgentClient,
    capabilities: frozenset,
    n: int,
    steps: int,
    depth: int = 1,
    env_id: str = "CartPole-v1",
) -> tuple[int, float, int]:
    """One episode of `n` CartPole copies driven through `agent` (`depth` requests in
    flight) for at least `steps` env steps (and `n` x 20), after a warm-up; (env steps,
    seconds, bytes on the wire) of the measured part."""

    def wire() -> int:
        return agent.transport.bytes_sent + agent.transport.bytes_received

    with BaseEnvManager(make_env_fns(env_id, None, n)) as manager:
        manager.launch(seed=0)
        agent.episode_started(to_jsonable({f"e{i}": o for i, o in manager.ready_obs.items()}))
        _drive(stepper_for(agent, capabilities, "bench", n, depth=depth), manager, max(n * 5, 100))
        before = wire()
        taken, seconds = _drive(
            stepper_for(agent, capabilities, "bench", n, depth=depth), manager, max(steps, n * 20)
        )
        sent = wire() - before
        agent.episode_stopped()
    return taken, seconds, sent


class InProcessClient(AgentClient):
    """The SDK's agent client calling a service object's handlers directly: the agent
    without HTTP (no transport, no pipeline), the request bodies built as over the wire."""

    def __init__(self, service: Any) -> None:
        super().__init__("http://in-process")
        self.service = service

    OPERATIONS = {"/policy": "getPolicy"}  # paths not named as their operation

    # (AgentClient.column_pipeline is typed as the class ColumnPipeline, not a protocol of
    # send/receive/close: this one is such a pipeline without being that class)
    def column_pipeline(self, stream: bool = False) -> "EagerPipeline":  # type: ignore[override]
        return EagerPipeline(self)

    def _call(
        self, method: str, path: str, *, json_body: Any = None, params: Any = None, **_: Any
    ) -> Any:
        handler = getattr(self.service, self.OPERATIONS.get(path, path.strip("/")))
        if json_body is None:
            return handler(**(params or {}))[0]
        return handler(json_body)[0]


class EagerPipeline:
    """A `ColumnPipeline` in process: each request runs as it is sent and its answer waits
    for `receive` (the order the service runs pipelined requests in)."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.answers: deque = deque()

    def send(self, **columns: Any) -> None:
        self.answers.append(self.client.step_columns(**columns))

    def send_body(self, body: Any) -> None:
        self.answers.append(self.client.post_step(body))

    def receive(self) -> Any:
        return self.answers.popleft()

    def close(self) -> None:
        self.answers.clear()


def cartpole_agent_config(name: str = "bench") -> dict:
    """What an orchestrator tells an agent about CartPole-v1 at registration."""
    env = gym.make("CartPole-v1")
    return {
        "name": name,
        "observationSpace": space_to_dict(env.observation_space),
        "actionSpace": space_to_dict(env.action_space),
    }


def start_random_agent(tmp: Path, name: str = "bench"):
    """A RandomAgent service on loopback, initialized and registered for CartPole-v1;
    returns (service process, client). The caller stops the service."""
    from mistk_rl.deploy.launch import start_service

    service = start_service(
        "agent",
        "agents.random_agent:RandomAgent",
        data_dir=tmp / "served",
        log_path=tmp / "agent.log",
    )
    client = service.client()
    client.initialize(hyperparameters={"seed": 0})
    client.build_model()
    client.agent_registered(cartpole_agent_config(name))
    return service, client


# how each mode reaches the agent: in process; over HTTP requests with stepColumns as JSON
# and binary (and binary on a CartPole whose rewards vary: `VariedRewardCartPole`), and
# pipelined (two requests in flight for two halves of the copies, pipelineDepth 2); on the
# agent's step stream (`mistk_rl.wire.frames`, what the gym orchestrator uses when the agent lists
# `stream`), one frame at a time (also with varying rewards) and pipelined; and the
# entity-keyed step. Pipelined, stream and entity modes are encoded as the gym orchestrator
# would (`binary_for`).
TRANSPORT_MODES = (
    "inprocess",
    "http",
    "http-binary",
    "http-binary-varied",
    "http-pipelined",
    "stream",
    "stream-varied",
    "stream-pipelined",
    "http-entity",
)
ORCHESTRATOR_ENCODED = (
    "http-pipelined",
    "stream",
    "stream-varied",
    "stream-pipelined",
    "http-entity",
)


ROUNDS = 5  # each configuration is timed in this many blocks, its modes taking turns


@dataclass
class Block:
    """One timed block of a mode: env steps, seconds, and bytes on the wire (over HTTP)."""

    steps: int
    seconds: float
    wire: int = 0


def interleaved(
    modes: Sequence[str], rounds: int, measure: Callable[[str], Block]
) -> dict[str, list[Block]]:
    """`rounds` blocks of each mode, timed round by round with every mode taking a turn in
    each: a shared machine's speed drifts over seconds (the same in-process loop has run
    30% apart a minute later), and a ratio of two modes is fair only between blocks timed
    side by side."""
    blocks: dict[str, list[Block]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode in modes:
            blocks[mode].append(measure(mode))
    return blocks


def summarize(blocks: dict[str, list[Block]], base: str, envs: int) -> list[dict]:
    """A record per mode (printed as a line): env steps/s over all its blocks; besides
    `base`, the ratio to it, round by round (median, and the range over the rounds); over
    HTTP, the bytes on the wire per env step."""
    records = []
    for mode, mine in blocks.items():
        rate = sum(b.steps for b in mine) / sum(b.seconds for b in mine)
        record = {
            "bench": "transport",
            "mode": mode,
            "envs": envs,
            "steps_per_s": round(rate, 1),
            "rounds": len(mine),
        }
        line = f"  transport {mode:18s} envs {envs:4d}: {rate:10.1f} env steps/s"
        if mode != base:
            ratios = sorted(
                (b.steps / b.seconds) / (o.steps / o.seconds) for b, o in zip(mine, blocks[base])
            )
            record.update(
                to_base=base,
                to_base_median=round(float(np.median(ratios)), 3),
                to_base_min=round(ratios[0], 3),
                to_base_max=round(ratios[-1], 3),
            )
            line += (
                f"  {np.median(ratios):5.2f} of {base} "
                f"({ratios[0]:.2f}-{ratios[-1]:.2f} over {len(ratios)} rounds)"
            )
        if any(b.wire for b in mine):  # over HTTP: what crossed the wire
            per_step = sum(b.wire for b in mine) / sum(b.steps for b in mine)
            record.update(
                wire_bytes_per_step=round(per_step, 1),
                raw_bytes_per_step=RAW_STEP_BYTES,
                wire_to_raw=round(per_step / RAW_STEP_BYTES, 2),
            )
            line += (
                f"  {per_step:7.1f} wire bytes/step "
                f"({per_step / RAW_STEP_BYTES:.2f}x the raw {RAW_STEP_BYTES})"
            )
        records.append(record)
        print(line)
    return records


def bench_transport(env_counts: list[int], steps: int, rounds: int = ROUNDS) -> list[dict]:
    """Modes: the agent in-process (its service object, no HTTP), over HTTP with stepColumns
    as JSON and in the binary encoding, and over HTTP with the entity-keyed step (what an
    agent without the columns capability gets), the last two encoded as the gym
    orchestrator would (`binary_for`). `steps` env steps a mode and env count, in `rounds`
    blocks taking turns with the other modes' (`interleaved`)."""
    from agents.random_agent import RandomAgent
    from mistk_rl.service.handlers import AgentService
    from orchestrators.gym_orchestrator import binary_for

    space = gym.make("CartPole-v1").observation_space
    records = []
    with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
        service = AgentService(RandomAgent(), Path(tmp) / "inprocess")
        service.initialize({"hyperparameters": {"seed": 0}})
        service.lifecycle.wait_for_state("initialized", 30)
        service.agentRegistered(cartpole_agent_config())
        served, client = start_random_agent(Path(tmp))
        inprocess = InProcessClient(service)
        try:
            for n in env_counts:

                def measure(mode: str) -> Block:
                    agent = inprocess if mode == "inprocess" else client
                    capabilities = frozenset(
                        {"step"}
                        if mode == "http-entity"
                        else {"columns", "stream"}
                        if mode.startswith("stream")
                        else {"columns"}
                    )
                    depth = 2 if mode.endswith("pipelined") else 1
                    client.binary = mode.startswith("http-binary") or (
                        mode in ORCHESTRATOR_ENCODED
                        and binary_for(capabilities | {"tensors"}, space, n, depth)
                    )
                    env_id = VARIED_ENV if mode.endswith("varied") else "CartPole-v1"
                    return Block(
                        *measure_steps(agent, capabilities, n, steps // rounds, depth, env_id)
                    )

                # (one copy does not pipeline: its next action waits for this one's outcome)
                modes = [m for m in TRANSPORT_MODES if not (m.endswith("pipelined") and n == 1)]
                records += summarize(interleaved(modes, rounds, measure), "inprocess", n)
            client.close()
        finally:
            served.stop()
    return records


# a DQN agent that acts epsilon-greedily with its network and keeps every transition, but
# never trains (the figures are of the step path, not of learning)
ACTING_DQN = {
    "seed": 0,
    "log_every": 0,
    "train": {"learning_starts": 0, "train_freq": 10**9},
    "policy": {"model": {"hidden_sizes": [64, 64]}},
}
LOCAL_MODES = ("dqn-inprocess", "dqn-http", "dqn-local")


def bench_local(
    env_counts: list[int], steps: int, batch_steps: int = 64, rounds: int = ROUNDS
) -> list[dict]:
    """Local inference against the agent acting remotely: a DQN agent (`ACTING_DQN`) in
    process (stepColumns to its service object), over HTTP (stepColumns) and through a
    policy copy here that sends its experience every `batch_steps` env steps
    (replayColumns), encoded as the gym orchestrator would (`binary_for`); the modes take
    turns (`interleaved`)."""
    from agents.dqn_agent import DQNAgent
    from mistk_rl.deploy.launch import start_service
    from mistk_rl.sdk.stepping import ColumnStepper, LocalInference, LocalStepper
    from mistk_rl.service.handlers import AgentService
    from orchestrators.gym_orchestrator import binary_for

    space = gym.make("CartPole-v1").observation_space
    records = []
    with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
        service = AgentService(DQNAgent(), Path(tmp) / "inprocess")
        service.initialize({"hyperparameters": ACTING_DQN})
        service.lifecycle.wait_for_state("initialized", 30)
        service.agentRegistered(cartpole_agent_config())
        served = start_service(
            "agent",
            "agents.dqn_agent:DQNAgent",
            data_dir=Path(tmp) / "served",
            log_path=Path(tmp) / "agent.log",
        )
        client = served.client()
        client.initialize(hyperparameters=ACTING_DQN)
        client.build_model()
        client.agent_registered(cartpole_agent_config())
        try:
            for n in env_counts:

                def measure(mode: str) -> Block:
                    agent = InProcessClient(service) if mode == "dqn-inprocess" else client
                    client.binary = binary_for(
                        frozenset({"columns", "tensors"}), space, n, local=mode == "dqn-local"
                    )
                    with BaseEnvManager(make_env_fns("CartPole-v1", None, n)) as manager:
                        manager.launch(seed=0)
                        agent.episode_started(
                            to_jsonable({f"e{i}": o for i, o in manager.ready_obs.items()})
                        )
                        make = (
                            (lambda: LocalStepper(agent, LocalInference(1, batch_steps)))
                            if mode == "dqn-local"
                            else (lambda: ColumnStepper(agent))
                        )
                        _drive(make(), manager, max(n * 5, 100))  # warm-up
                        taken, seconds = _drive(make(), manager, max(steps // rounds, n * 20))
                        agent.episode_stopped()
                    return Block(taken, seconds)

                records += summarize(interleaved(LOCAL_MODES, rounds, measure), "dqn-inprocess", n)
            client.close()
        finally:
            served.stop()
    return records


WARMUP_STEPS = 5  # batched steps before timing, for every manager and vector env alike


def bench_envs(env_counts: list[int], steps: int) -> list[dict]:
    records = []
    for env_id, label in (("CartPole-v1", "CartPole-v1"), (SLOW_ENV, "SlowCartPole-1ms")):
        for n in env_counts:
            # at least 50 batched steps, after a warm-up: with fewer (the 1 ms env used to
            # get 10 at 64 envs) the figure was mostly the first steps' start-up noise
            total = max(steps if label == "CartPole-v1" else steps // 10, n * 50)
            runs: dict[str, Callable[[], float]] = {
                name: partial(_manager_rate, cls, env_id, n, total)
                for name, cls in MANAGERS.items()
            }
            runs["gym_sync"] = lambda: _vector_rate(gym.vector.SyncVectorEnv, env_id, n, total)
            runs["gym_async"] = lambda: _vector_rate(gym.vector.AsyncVectorEnv, env_id, n, total)
            for mode, run in runs.items():
                rate = run()
                records.append(
                    {
                        "bench": "envs",
                        "env": label,
                        "mode": mode,
                        "envs": n,
                        "steps_per_s": round(rate, 1),
                    }
                )
                print(f"  envs {label:16s} {mode:10s} envs {n:4d}: {rate:10.1f} env steps/s")
    return records


def _manager_rate(cls: type, env_id: str, n: int, total: int) -> float:
    """Constant actions in a bare loop: the same work `_vector_rate` asks of gymnasium."""
    with cls(make_env_fns(env_id, None, n)) as manager:
        manager.launch(seed=0)
        for _ in range(WARMUP_STEPS):
            manager.step(dict.fromkeys(manager.ready_obs, 0))
        done, started = 0, time.perf_counter()
        while done < total:
            done += len(manager.step(dict.fromkeys(manager.ready_obs, 0)))
        return done / (time.perf_counter() - started)


def _vector_rate(cls: type, env_id: str, n: int, total: int) -> float:
    # SAME_STEP: an episode's end and the next reset in one step, as our managers do. With
    # gymnasium's default (NEXT_STEP) the step after an end only resets, skipping env.step:
    # a free step per episode (about 1 in 10 here), which would flatter gymnasium.
    envs = cls([lambda: gym.make(env_id)] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        envs.reset(seed=0)
        actions = np.zeros(n, dtype=np.int64)
        for _ in range(WARMUP_STEPS):
            envs.step(actions)
        done, started = 0, time.perf_counter()
        while done < total:
            envs.step(actions)
            done += n
        return done / (time.perf_counter() - started)
    finally:
        envs.close()
