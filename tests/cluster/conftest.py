"""A real three-node Ray cluster on this machine (`ray.cluster_utils.Cluster`): a head and
two nodes with custom resources (``alpha``, ``beta``), so a service can be pinned to a node.

These tests run only inside a loopback-only network namespace, where every Ray process binds
127.0.0.1 (`tests/test_cluster.py` starts them there with ``unshare --net``): outside one,
Ray would bind the machine's interface address."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster():
    if os.environ.get("MISTK_RL_NETNS") != "1":
        pytest.skip("runs inside a loopback-only network namespace (tests/test_cluster.py)")
    import ray
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head": 4}})
    nodes = {
        "alpha": made.add_node(num_cpus=2, resources={"alpha": 4}),
        "beta": made.add_node(num_cpus=2, resources={"beta": 4}),
    }
    ray.init(address=made.address, namespace="mistk-rl", log_to_driver=False)
    made.wait_for_nodes()
    made.node_ids = {name: node.node_id for name, node in nodes.items()}
    made.node_ids["head"] = made.head_node.node_id
    yield made
    ray.shutdown()
    made.shutdown()


@pytest.fixture
def add_node(cluster):
    """Add a node to the cluster for one test (removed after it, if the test did not)."""
    added = []

    def _add(**node_args):
        node = cluster.add_node(**node_args)
        added.append(node)
        cluster.wait_for_nodes()
        return node

    yield _add
    for node in added:
        if node in cluster.worker_nodes:
            cluster.remove_node(node)


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # services import agents/ and orchestrators/ from here
