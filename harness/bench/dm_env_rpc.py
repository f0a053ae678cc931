"""`mistk-rl bench dm-env-rpc`: steps per second through the dm_env_rpc bridge.

    mistk-rl bench dm-env-rpc [--steps 5000] [--json FILE]

env: one CartPole-v1 stepped in process, and the same env served by our dm_env_rpc server
(`mistk_rl.bridges.dm_env_rpc_server`) and stepped through our client
(`mistk_rl.bridges.dm_env_rpc_client.DmEnvRpcEnv`), constant actions, auto-reset.
orchestrator: the gym orchestrator with the random agent (both real services on loopback)
playing `--steps` env steps of CartPole-v1 made in process and of worlds of that server, at
1 and 8 env copies, with the in-process (base) and asynchronous subprocess env managers.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from mistk_rl.bridges.dm_env_rpc_client import DmEnvRpcEnv
from mistk_rl.bridges.dm_env_rpc_server import EnvSource, serve
from mistk_rl.deploy.launch import spawn_service, wait_ready
from mistk_rl.sdk.schemas import DmEnvRpcSettings

ORCHESTRATOR = "orchestrators.gym_orchestrator:GymOrchestrator"
RANDOM_AGENT = "agents.random_agent:RandomAgent"


def env_rate(env: gym.Env, steps: int) -> float:
    """Env steps per second with action 0 (resetting when an episode ends)."""
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            env.reset()
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def orchestrator_rates(address: str, steps: int) -> list[dict[str, Any]]:
    """The gym orchestrator's env steps per second, plain and over dm_env_rpc."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        services = [
            spawn_service(
                role, target, data_dir=Path(tmp) / role, log_path=Path(tmp) / f"{role}.log"
            )
            for role, target in (("orchestrator", ORCHESTRATOR), ("agent", RANDOM_AGENT))
        ]
        try:
            for service in services:
                wait_ready(service, 60)
            orch_service, agent_service = services
            agent = agent_service.client()
            agent.initialize(hyperparameters={"seed": 0})
            agent.build_model()
            for label, env in (
                ("in process", {"id": "CartPole-v1"}),
                ("dm_env_rpc", {"id": "CartPole-v1", "dmEnvRpc": {"address": address}}),
            ):
                orch = orch_service.client(timeout=120)
                orch.initialize(env)
                orch.register_agent("player", agent_service.url)
                for manager in ("base", "async"):
                    for n in (1, 8):
                        rows.append(_rate(orch, label, manager, n, steps))
                orch.reset()
                agent.reset()
                agent.initialize(hyperparameters={"seed": 0})
                agent.build_model()
        finally:
            for service in services:
                service.begin_stop()
            for service in services:
                service.stop()
    return rows


def _rate(orch: Any, label: str, manager: str, n: int, steps: int) -> dict[str, Any]:
    config = {"numSteps": steps, "numEnvs": n, "envManager": manager, "train": False, "seed": 0}
    orch.start_episode({**config, "numSteps": max(n, steps // 10)}, wait=True, timeout=600)
    orch.stop_episode()
    before, start = orch.status().payload.get("envSteps", 0), time.perf_counter()
    orch.start_episode(config, wait=True, timeout=600)
    wall = time.perf_counter() - start
    orch.stop_episode()
    done = orch.status().payload.get("envSteps", 0) - before
    return {"env": label, "manager": manager, "envs": n, "steps_per_s": round(done / wall)}


def bench_dm_env_rpc(steps: int = 5000) -> list[dict[str, Any]]:
    """The bench (module doc): a record for the bare env each way, then one per
    orchestrator configuration; each printed as a JSON line."""
    with serve(EnvSource("CartPole-v1")) as server:
        remote = DmEnvRpcEnv(DmEnvRpcSettings(address=server.address), {})
        records: list[dict[str, Any]] = [
            {"env": "in process", "steps_per_s": round(env_rate(gym.make("CartPole-v1"), steps))},
            {"env": "dm_env_rpc", "steps_per_s": round(env_rate(remote, steps))},
        ]
        records += orchestrator_rates(server.address, steps)
    for record in records:
        print(json.dumps(record))
    return records
