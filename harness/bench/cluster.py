"""Cluster benchmarks (`mistk-rl bench cluster`): what placing services with Ray costs and
gives, on a local Ray cluster (`ray.cluster_utils.Cluster`: a head and worker nodes, all on
this machine).

league: `configs/tictactoe_league.yaml` for a fixed budget of main-player moves (`--steps`,
default 10,000; one evaluation, at the end), the main player's moves per second of the run
so far at that evaluation: without Ray, then on the cluster with both game workers on one
worker node and with one worker on each of two nodes (the league orchestrator and the agents
on the head). On one machine every node shares its cores: the figures say what placement
costs, not what more machines give.

transport: `bench transport`'s http-binary mode (the random agent, CartPole) at 1 and 64 env
copies, the agent started here and placed on a worker node by Ray. The step path is plain
HTTP between processes either way, so the two should agree within noise.

Ray binds the machine's interface address by default: on a machine whose interface is not
to be used, run the bench in a loopback-only network namespace (``unshare --net
--map-root-user``, then ``ip link set lo up``).
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import yaml

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

REPO = Path(__file__).resolve().parents[2]
LEAGUE_CONFIG = REPO / "configs" / "tictactoe_league.yaml"


def _local_cluster(worker_nodes: int) -> tuple[Cluster, dict[str, Any]]:
    """A head (4 logical CPUs, resource ``head``) and `worker_nodes` nodes (``w0``,
    ``w1``...), joined by this process; the cluster and its worker nodes by name."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 4, "resources": {"head": 8}}
    )
    named = {
        f"w{i}": cluster.add_node(num_cpus=2, resources={f"w{i}": 2}) for i in range(worker_nodes)
    }
    ray.init(address=cluster.address, namespace="mistk-rl", log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster, named


def _close(cluster: Cluster) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


class _AtFirstCheckpoint(threading.Thread):
    """Runs `action` once the run in `run_dir` saved its first checkpoint (its progress.json
    appears), as a node is lost at some point of a run: polling in a thread of its own
    (`start`), or at the run's next line (as its `say`: in the main thread, where Ray can
    add a node; it registers a signal handler)."""

    def __init__(self, run_dir: Path, action: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.action, self.done = run_dir, action, threading.Event()
        self.fired_at: Optional[int] = None

    def run(self) -> None:
        while not self.done.wait(0.2):
            if self.fire_if_due():
                return

    def __call__(self, _line: str) -> None:
        if self.fired_at is None:
            self.fire_if_due()

    def fire_if_due(self) -> bool:
        progress = self.run_dir / "progress.json"
        if not progress.exists():
            return False
        data = json.loads(progress.read_text())
        self.fired_at = data.get("train_steps", data.get("agent_steps"))
        self.action()
        return True


def _league_run(
    steps: int, worker_nodes: int, out: Path, lose_node: bool = False
) -> dict[str, Any]:
    """One league run of `steps` main-player moves; placed on the cluster when
    `worker_nodes` > 0 (workers spread over the nodes, the rest on the head). `lose_node`:
    the config as it is (its targets stop the run), the last worker node removed after the
    first evaluation and another with its resources added."""
    from harness.config import RunConfig
    from harness.run import run

    data = _league_config(steps, worker_nodes, out, lose_node)
    cluster, named = _local_cluster(worker_nodes) if worker_nodes else (None, {})

    def lose_and_replace() -> None:
        """The last worker node is lost; a machine offering the same resources joins (as
        a cluster's autoscaler brings one), where the harness starts the lost worker again."""
        assert cluster is not None  # (a node is lost only on a cluster)
        last = f"w{worker_nodes - 1}"
        cluster.remove_node(named[last])
        named[last] = cluster.add_node(num_cpus=2, resources={last: 2})

    loss = _AtFirstCheckpoint(out / "run", lose_and_replace)
    try:  # (the loss at the run's first line after its first checkpoint: the main thread)
        results = run(
            RunConfig.model_validate(data),
            out / "run",
            say=loss if lose_node else lambda _: None,
            quiet=not lose_node,
        )
    finally:
        loss.done.set()
        if cluster is not None:
            _close(cluster)
    last = results["evals"][-1]
    record = {
        "bench": "cluster-league",
        "worker_nodes": worker_nodes,
        "main_moves": last["agent_steps"],
        "wall_s": last["wall_s"],
        "moves_per_s": round(last["agent_steps"] / last["wall_s"], 1),
    }
    if lose_node:
        record.update(_after_the_loss(results, loss.fired_at))
    return record


def _league_config(steps: int, worker_nodes: int, out: Path, lose_node: bool) -> dict[str, Any]:
    """configs/tictactoe_league.yaml as the bench runs it: for `steps` moves with one
    evaluation, at the end (unless a node is lost: then to its targets); on a cluster, its
    workers spread over the worker nodes and the rest on the head."""
    data = yaml.safe_load(LEAGUE_CONFIG.read_text())
    if not lose_node:
        data["game_training"].update(agent_steps=steps, eval_every=steps, stop_when=[])
        data["evaluation"]["against"] = [{"opponent": "random", "exhaustive": True}]
    if worker_nodes:
        data["cluster"] = {"address": "auto", "data_root": str(out / "nodes")}
        for i, worker in enumerate(data["workers"]):
            worker.update(cpus=0.5, resources={f"w{i % worker_nodes}": 1})
        for service in [data["orchestrator"], *data["agents"]]:
            service.update(cpus=0.5, resources={"head": 1})
    return data


def _after_the_loss(results: dict[str, Any], lost_at: Optional[int]) -> dict[str, Any]:
    """What a run that lost a worker node did: whether it still met its targets, and what
    became of its workers (each one's state and replacement, and where they ran)."""
    return dict(
        lost_node_at=lost_at,
        passed=bool(results.get("first_pass")),
        first_pass=results.get("first_pass"),
        evaluation=results["evaluation"],
        workers=[
            {k: w[k] for k in ("url", "state", "jobs", "failed", "replaced_by")}
            for w in results["league"]["workers"]
        ],
        placement={
            name: where for name, where in results["placement"].items() if name.startswith("worker")
        },
    )


def _dqn_run(out: Path, seed: int, lose_node: bool) -> dict[str, Any]:
    """configs/cartpole_dqn.yaml (seed `seed`) on a cluster of two worker nodes, the agent
    on one of them (``trainer``); `lose_node`: that node removed after the first
    checkpoint, so the run restarts and resumes the agent on the other."""
    from harness.config import RunConfig, with_seed
    from harness.run import run_restarting

    data = yaml.safe_load((REPO / "configs" / "cartpole_dqn.yaml").read_text())
    cluster, _ = _local_cluster(0)
    nodes = [cluster.add_node(num_cpus=2, resources={"trainer": 1}) for _ in range(2)]
    cluster.wait_for_nodes()
    data["cluster"] = {"address": "auto", "data_root": str(out / "nodes")}
    data["orchestrator"].update(cpus=0.5, resources={"head": 1})
    data["agents"][0].update(cpus=1, resources={"trainer": 1})
    run_dir, agent_node = out / "run", []

    def say(line: str) -> None:
        started = re.search(r"started agent player .* on node (\w+)", line)
        if started:
            agent_node.append(started.group(1))

    loss = _AtFirstCheckpoint(
        run_dir,
        lambda: cluster.remove_node(next(n for n in nodes if n.node_id.startswith(agent_node[-1]))),
    )
    if lose_node:
        loss.start()
    try:
        results = run_restarting(
            with_seed(RunConfig.model_validate(data), seed),
            run_dir,
            say,
            None,
            True,
            False,
            max_restarts=2,
        )
    finally:
        loss.done.set()
        _close(cluster)
    success = results.get("first_success") or {}
    return {
        "bench": "cluster-dqn",
        "seed": seed,
        "lost_node_at": loss.fired_at,
        "resumed_at": results.get("resumed_at", []),
        "reached_475_at": success.get("env_steps"),
        "last_eval": results["evals"][-1]["mean_return"],
    }


def bench_cluster_loss(seeds: list[int]) -> list[dict[str, Any]]:
    """configs/tictactoe_league.yaml to its targets on the cluster, its workers on two
    nodes, one of which is removed after the first evaluation; and configs/cartpole_dqn.yaml
    per seed on the cluster with and without losing its agent's node."""
    records = []
    for seed in seeds:
        for lose in (False, True):
            with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
                record = _dqn_run(Path(tmp), seed, lose)
            print(
                f"  cluster dqn seed {seed} node lost at {record['lost_node_at']}: resumed "
                f"at {record['resumed_at']}, 475 reached at {record['reached_475_at']} env "
                f"steps (last eval {record['last_eval']})",
                flush=True,
            )
            records.append(record)
    with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
        record = _league_run(0, 2, Path(tmp), lose_node=True)
    print(
        f"  cluster league: a worker node lost at {record['lost_node_at']} moves; "
        f"targets met: {record['passed']} {record['first_pass']}; "
        f"workers {record['workers']}; placement {record['placement']}; "
        f"evaluation {record['evaluation']}",
        flush=True,
    )
    return records + [record]


def bench_cluster_league(steps: int = 10_000) -> list[dict[str, Any]]:
    records = []
    for worker_nodes in (0, 1, 2):
        with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
            record = _league_run(steps, worker_nodes, Path(tmp))
        where = f"Ray, workers on {worker_nodes} node(s)" if worker_nodes else "no Ray"
        print(
            f"  cluster league {where:26s}: {record['main_moves']:7d} main-player moves "
            f"in {record['wall_s']:7.1f} s = {record['moves_per_s']:7.1f} moves/s",
            flush=True,
        )
        records.append(record)
    return records


def bench_cluster_transport(env_counts: list[int], steps: int) -> list[dict[str, Any]]:
    from harness.bench.step import cartpole_agent_config, measure_steps, start_random_agent
    from mistk_rl.deploy.cluster import Cluster as Placement
    from mistk_rl.deploy.cluster import Resources
    from mistk_rl.sdk.client import AgentClient

    records = []
    with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
        local, local_client = start_random_agent(Path(tmp) / "local")
        cluster, _ = _local_cluster(1)
        placement = Placement("auto", run_id="bench", data_root=str(Path(tmp) / "nodes"))
        placed = placement.spawn(
            "agent",
            "bench",
            "agents.random_agent:RandomAgent",
            resources=Resources(cpus=1, custom={"w0": 1}),
        )
        try:
            placed.wait_ready(60)
            placed_client = AgentClient(placed.url)
            placed_client.initialize(hyperparameters={"seed": 0})
            placed_client.build_model()
            placed_client.agent_registered(cartpole_agent_config())
            for n in env_counts:
                for where, client in (("here", local_client), ("ray", placed_client)):
                    client.binary = True
                    taken, seconds, _ = measure_steps(client, frozenset({"columns"}), n, steps)
                    record = {
                        "bench": "cluster-transport",
                        "placed": where,
                        "envs": n,
                        "steps_per_s": round(taken / seconds, 1),
                    }
                    print(
                        f"  cluster transport agent {where:4s} envs {n:4d}: "
                        f"{taken / seconds:10.1f} env steps/s",
                        flush=True,
                    )
                    records.append(record)
            placed_client.close()
            local_client.close()
        finally:
            placed.stop()
            placement.close()
            _close(cluster)
            local.stop()
    return records


def bench_cluster(env_counts: list[int], steps: int, league_steps: int) -> list[dict]:
    started = time.monotonic()
    records = bench_cluster_transport(env_counts, steps)
    records += bench_cluster_league(league_steps)
    print(f"  ({time.monotonic() - started:.0f} s)")
    return records
