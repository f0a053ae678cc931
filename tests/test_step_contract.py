"""The step contract's one home (`mistk_rl.wire.step_columns`): a field a step reports is added
by its line in the spec, its row in `REPORTED` and the learner that reads it; nothing else.

The test adds one (a per-step cost) exactly that way and sends it through the service's
real app (over ASGI, in process), in both encodings."""

from __future__ import annotations

import asyncio
import copy
import json

import numpy as np
import pytest

from agents.random_agent import RandomAgent
from harness.bench.step import cartpole_agent_config
from mistk_rl.service import app as service_app
from mistk_rl.service.handlers import AgentService
from mistk_rl.wire import codec, step_columns
from mistk_rl.wire.jsonable import to_jsonable
from mistk_rl.wire.step_columns import REPORTED, ReportedField, step_body
from tests.test_pipeline import _asgi

PACKAGED_SPEC = service_app.load_spec
COSTS = ReportedField("costs", "costs", "number", required=False, default=0.0)


class CostLearner(RandomAgent):
    """The learner that reads the new field: it keeps each batch's costs."""

    def do_initialize(self, props, hparams) -> None:
        super().do_initialize(props, hparams)
        self.costs: list[np.ndarray] = []

    def do_learn(self, transitions) -> None:
        self.costs.append(transitions.reported["costs"])


def _spec_with_costs(role: str) -> dict:
    """Place 1: the spec's StepColumns, with the field's line."""
    spec = copy.deepcopy(PACKAGED_SPEC(role))
    if role == "agent":
        properties = spec["components"]["schemas"]["StepColumns"]["properties"]
        properties["costs"] = {
            "$ref": "#/components/schemas/Column",
            "description": "Per row the reported step's cost.",
        }
    return spec


@pytest.fixture
def with_costs(monkeypatch):
    monkeypatch.setattr(service_app, "load_spec", _spec_with_costs)  # 1: the spec
    monkeypatch.setattr(step_columns, "REPORTED", (*REPORTED, COSTS))  # 2: the table


def _app(tmp_path):
    agent = CostLearner()
    service = AgentService(agent, tmp_path)
    service.initialize({"hyperparameters": {"seed": 0}})
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered(cartpole_agent_config("p"))
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    return agent, service_app.create_app(service)


def _post(app, body: dict, binary: bool) -> tuple[int, dict]:
    if binary:
        data, kind = codec.encode(body, columns=True), codec.CONTENT_TYPE
    else:
        data, kind = json.dumps(to_jsonable(body)).encode(), "application/json"
    status, _, answer = asyncio.run(
        _asgi(
            app,
            "POST",
            "/v1/mistk/agent/stepColumns",
            "",
            [(b"content-type", kind.encode()), (b"content-length", str(len(data)).encode())],
            [data],
        )
    )
    return status, json.loads(answer)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_a_new_step_field_takes_the_spec_the_table_and_the_learner(tmp_path, with_costs, binary):
    agent, app = _app(tmp_path)
    obs = np.zeros((3, 4), np.float32)
    status, first = _post(app, step_body([0, 1, 2], obs), binary)
    assert status == 200, first
    body = step_body(
        [0, 1, 2],
        obs + 1,
        step_ids=first["stepIds"],
        rewards=[1.0, 1.0, 1.0],
        terminated=[False, False, False],
        costs=[0.5, 0.0, 2.5],  # what the client's step_columns(costs=...) sends
    )
    status, answer = _post(app, body, binary)
    assert status == 200, answer
    assert [c.tolist() for c in agent.costs] == [[0.5, 0.0, 2.5]]
    # a bad column is refused with the field named, and nothing is learned
    body["stepIds"], body["costs"] = np.asarray(answer["stepIds"]), np.array([1.0, 2.0])
    status, problem = _post(app, body, binary)
    assert status == 400 and problem["detail"] == "costs: 2 rows, where envs has 3"
    assert len(agent.costs) == 1


def test_the_new_field_left_out_gets_its_default(tmp_path, with_costs):
    agent, app = _app(tmp_path)
    _, first = _post(app, step_body([4], np.zeros((1, 4))), binary=False)
    body = step_body([4], np.ones((1, 4)), step_ids=first["stepIds"], rewards=[0], terminated=[1])
    assert _post(app, body, binary=False)[0] == 200
    assert [c.tolist() for c in agent.costs] == [[0.0]]


def test_without_its_spec_line_the_field_is_refused_and_nothing_is_learned(tmp_path):
    agent, app = _app(tmp_path)
    _, first = _post(app, step_body([0], np.zeros((1, 4))), binary=False)
    body = step_body([0], np.ones((1, 4)), step_ids=first["stepIds"], rewards=[1], terminated=[0])
    body["costs"] = np.array([1.0])
    status, problem = _post(app, body, binary=False)
    assert status == 400 and "costs" in problem["detail"]
    assert agent.costs == []


def test_a_field_the_table_does_not_list_is_a_type_error_for_the_caller():
    with pytest.raises(TypeError, match=r"reports \['rewards', 'terminated', 'truncated'\]"):
        step_body([0], [[0, 0, 0, 0]], costs=[1.0])


def test_the_core_fields_stay_attributes_of_the_transitions(tmp_path):
    """A reported field named like a `Transitions` field lands there, not in `reported`."""
    from mistk_rl.wire.step_columns import ColumnStep

    step = ColumnStep(
        None,
        np.array([7]),
        np.array([0]),
        {"rewards": np.array([2.0]), "terminated": np.array([True]), "truncated": np.array([0])},
        np.zeros((1, 4)),
        None,
    )

    class Kept:
        obs, actions, extras = np.zeros((1, 4)), np.array([1]), {}

    transitions = step.transitions(Kept())
    assert transitions.rewards.tolist() == [2.0] and transitions.terminated.tolist() == [True]
    assert transitions.reported == {}
