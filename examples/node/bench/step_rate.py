"""Env steps/s of the Node random agent next to the Python one, on the gym orchestrator's
step loop (`harness.bench.step.measure_steps`: CartPole-v1, stepColumns as JSON), at the
given env counts. Run from the repository root after `npm ci && npm run build`:

    python examples/node/bench/step_rate.py --envs 1,64 --steps 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node_services import start_node

from harness.bench.step import cartpole_agent_config, measure_steps, start_random_agent
from mistk_rl.sdk.client import AgentClient


def rates(client: AgentClient, envs: list[int], steps: int) -> dict[str, float]:
    capabilities = frozenset(client.api_version().capabilities)
    out = {}
    for n in envs:
        taken, seconds, _ = measure_steps(client, capabilities, n, steps)
        out[str(n)] = round(taken / seconds, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="1,64")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    envs = [int(n) for n in args.envs.split(",")]
    figures: dict[str, Any] = {"env": "CartPole-v1", "encoding": "json", "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        node = start_node("agent", Path(tmp) / "node", Path(tmp) / "node.log")
        try:
            client = AgentClient(node.url)
            client.initialize(hyperparameters={"seed": 0})
            client.build_model()
            client.agent_registered(cartpole_agent_config())
            figures["node_agent_steps_per_s"] = rates(client, envs, args.steps)
        finally:
            node.stop()
        service, client = start_random_agent(Path(tmp))
        try:
            figures["python_agent_steps_per_s"] = rates(client, envs, args.steps)
        finally:
            service.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
