"""`mistk-rl bench games`: moves per second of the game orchestrator on tic-tac-toe, with its
agent called in-process (the agent's service object, no HTTP) and over HTTP (a real gunicorn
service on loopback), at each number of game copies, in one run.

The loop is the GameOrchestrator's own: the same orchestrator object plays the same games,
only its agent client differs. Two agents, each holding both seats (self-play):
``random`` (masked random moves: the cost of the loop and the transport) and ``dqn``
(configs/tictactoe_selfplay_dqn.yaml's agent, learning: one update per move).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from mistk_rl.framework.orchestrator import RegisteredAgent
from mistk_rl.sdk.schemas import EpisodeConfig
from mistk_rl.wire.jsonable import to_jsonable

if TYPE_CHECKING:
    from mistk_rl.deploy.launch import ServiceProcess
    from mistk_rl.sdk.client import AgentClient

AGENTS = {"random": "agents.opponent_agents:MaskedRandomAgent", "dqn": "agents.dqn_agent:DQNAgent"}
GAME = "classic/tictactoe-v3"
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tictactoe_selfplay_dqn.yaml"


class InProcessGameClient:
    """The agent client calls the GameOrchestrator makes, answered by an AgentService object
    in this process: the same bodies (as JSON-able data), the same validation, no HTTP."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def episode_started(self, obs: dict, mode: str = "collect", **_: Any) -> None:
        self.service.episodeStarted({"obs": to_jsonable(obs), "mode": mode})

    def step(
        self, obs: dict, replay: Optional[dict] = None, action_mask: Optional[dict] = None
    ) -> dict:
        body: dict[str, Any] = {"obs": to_jsonable(obs)}
        if replay:
            body["replay"] = to_jsonable(replay)
        if action_mask:
            body["actionMask"] = to_jsonable(action_mask)
        return self.service.step(body)[0]["actions"]

    def replay_action(self, replay: dict) -> None:
        self.service.replayAction(to_jsonable(replay))

    def episode_stopped(self) -> None:
        self.service.episodeStopped()


def _hyperparameters(agent: str) -> dict:
    if agent == "random":
        return {"seed": 0}
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    return config["agents"][0]["hyperparameters"]


def bench_games(copies: list[int], moves: int) -> list[dict]:
    records = []
    with tempfile.TemporaryDirectory(prefix="mistk-bench-games-") as tmp:
        for agent, target in AGENTS.items():
            for n in copies:
                for mode in ("inprocess", "http"):
                    rate = _moves_per_s(agent, target, mode, n, moves, Path(tmp))
                    records.append(
                        {
                            "bench": "games",
                            "game": GAME,
                            "agent": agent,
                            "mode": mode,
                            "copies": n,
                            "moves_per_s": round(rate, 1),
                        }
                    )
                    print(
                        f"  games {agent:6s} {mode:9s} copies {n:3d}: {rate:9.1f} moves/s",
                        flush=True,
                    )
    return records


def _moves_per_s(agent: str, target: str, mode: str, n: int, moves: int, tmp: Path) -> float:
    """A fresh GameOrchestrator's moves per second over `n` game copies, its one agent
    (holding every seat) served over HTTP or called in-process (`mode`)."""
    from orchestrators.game_orchestrator import GameOrchestrator

    orch = GameOrchestrator()
    orch.do_initialize({"id": GAME, "kwargs": {}}, 1)
    seats = tuple(orch.seats)
    config = {"name": "bench", **orch.agent_config("bench", seats)}
    served: Optional[ServiceProcess] = None
    client: Any
    if mode == "http":
        served, client = _served_agent(agent, target, config, tmp / f"{agent}-{n}")
    else:
        client = _in_process_agent(agent, target, config, tmp / f"in-{agent}-{n}")
    try:
        orch.agents["bench"] = RegisteredAgent(
            "bench", "http://127.0.0.1", False, client, frozenset({"step"}), seats
        )
        # warm-up past the DQN's learning_starts, so updates are timed too
        orch.do_start_episode(EpisodeConfig(num_steps=2000, num_envs=n, seed=0))
        before, started = orch.env_steps, time.perf_counter()
        orch.do_start_episode(EpisodeConfig(num_steps=moves, num_envs=n, seed=1))
        return (orch.env_steps - before) / (time.perf_counter() - started)
    finally:
        orch.do_terminate()
        if served is not None:
            client.close()
            served.stop()


def _served_agent(
    agent: str, target: str, config: dict, where: Path
) -> tuple[ServiceProcess, AgentClient]:
    """The agent as a service (a gunicorn process on loopback), registered by `config`;
    its data dir `where`, its log beside it."""
    from mistk_rl.deploy.launch import start_service

    served = start_service(
        "agent", target, data_dir=where, log_path=where.with_name(f"{where.name}.log")
    )
    client = served.client()
    client.initialize(hyperparameters=_hyperparameters(agent))
    client.build_model()
    client.agent_registered(config)
    return served, client


def _in_process_agent(agent: str, target: str, config: dict, where: Path) -> InProcessGameClient:
    """The agent's service object in this process, registered by `config` (data dir
    `where`), behind the calls the orchestrator makes."""
    from mistk_rl.service.handlers import AgentService

    module, name = target.split(":")
    impl = getattr(__import__(module, fromlist=[name]), name)()
    service = AgentService(impl, where)
    service.initialize({"hyperparameters": _hyperparameters(agent)})
    service.lifecycle.wait_for_state("initialized", 30)
    service.buildModel()
    service.lifecycle.wait_for_state("initialized", 30)
    service.agentRegistered(config)
    return InProcessGameClient(service)
