"""A model an agent drops is freed when it is dropped, not at some later full collection.

A league resets its exploiters to their initial weights and loads snapshots into its frozen
opponents many times an hour: each time, the agent service builds a new model and drops the
old one. A model is held together by reference cycles, so refcounting alone never frees
it; the agents here run with the automatic collector off, standing for a long-running
service whose full collections are rare, where each dropped model stayed (the league soak's
main exploiter grew ~16 MiB a reset).
"""

from __future__ import annotations

import gc
import weakref

import pytest

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from mistk_rl.framework.agent import AbstractAgent
from mistk_rl.service.handlers.agent import AgentService
from tests.test_step_columns import SPACES


@pytest.fixture
def no_automatic_collection():
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def _served(tmp_path, agent: AbstractAgent) -> AgentService:
    service = AgentService(agent, tmp_path / type(agent).__name__)
    service.initialize({"hyperparameters": {"seed": 0, "log_every": 0}})
    service.lifecycle.wait_for_state("initialized", 10)
    service.buildModel()
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered({"name": "p", **SPACES})
    service.saveModel("initial.pt")
    service.lifecycle.wait_for_state("ready", 10)
    return service


def _model_parts(agent) -> list[weakref.ref]:
    model = agent._model
    return [weakref.ref(part) for part in (model.policy, model.learner, model.trainer)]


@pytest.mark.parametrize("agent_cls", [DQNAgent, PPOAgent])
def test_a_model_replaced_by_build_model_is_freed_at_once(
    tmp_path, agent_cls, no_automatic_collection
):
    service = _served(tmp_path, agent_cls())
    old = _model_parts(service.agent)
    service.buildModel("initial.pt")  # (a league's reset: its initial weights again)
    service.lifecycle.wait_for_state("ready", 10)
    assert service.agent._model is not None
    assert [part() for part in old] == [None, None, None]


def test_a_model_unloaded_by_reset_is_freed_at_once(tmp_path, no_automatic_collection):
    service = _served(tmp_path, DQNAgent())
    old = _model_parts(service.agent)
    service.reset(unload_model=True)
    service.lifecycle.wait_for_state("started", 10)
    assert [part() for part in old] == [None, None, None]


def test_only_a_change_that_drops_a_model_pays_for_the_collection(tmp_path, monkeypatch):
    """A full collection takes a few hundred ms in a process this size: a service's first
    buildModel and a reset that keeps the model run none."""
    import mistk_rl.service.handlers.agent as handlers

    runs: list[int] = []
    monkeypatch.setattr(handlers, "_free_dropped_models", lambda: runs.append(1))
    service = _served(tmp_path, DQNAgent())  # (initialize, the first buildModel, register)
    assert runs == []
    service.reset(unload_model=False)
    service.lifecycle.wait_for_state("initialized", 10)
    assert runs == []
    service.buildModel("initial.pt")
    service.lifecycle.wait_for_state("initialized", 10)
    assert runs == [1]
