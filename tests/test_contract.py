"""The spec is the source of truth: every operation has a handler and an SDK method, and the
typed models carry exactly the spec's fields."""

from __future__ import annotations

import inspect
import re

import pytest
from pydantic.alias_generators import to_snake

from mistk_rl.lifecycle import AGENT, ORCHESTRATOR
from mistk_rl.lifecycle.machine import api_name
from mistk_rl.sdk import schemas
from mistk_rl.sdk.client import AgentClient, OrchestratorClient
from mistk_rl.service.app import load_spec
from mistk_rl.service.handlers import AgentService, OrchestratorService
from mistk_rl.wire import step_columns

ROLES = [
    ("agent", AgentService, AgentClient, AGENT),
    ("orchestrator", OrchestratorService, OrchestratorClient, ORCHESTRATOR),
]
SHARED_SCHEMAS = [
    "Problem",
    "Status",
    "ApiVersion",
    "Tensor",
    "TensorMap",
    "Space",
    "FundamentalSpace",
    "DictSpace",
]


def operations(role: str):
    for path, methods in load_spec(role)["paths"].items():
        for method, op in methods.items():
            yield path, method, op


@pytest.mark.parametrize("role, service_cls, client_cls, table", ROLES)
def test_every_operation_has_a_handler_and_an_sdk_method(role, service_cls, client_cls, table):
    for _path, _method, op in operations(role):
        op_id = op["operationId"]
        handler = getattr(service_cls, op_id, None)
        assert callable(handler), f"{role}: no handler for {op_id}"
        sdk = getattr(client_cls, to_snake(op_id), None)
        assert callable(sdk), f"{role}: SDK has no {to_snake(op_id)} for {op_id}"
        params = {to_snake(p["name"]) for p in op.get("parameters", []) if "$ref" not in p}
        handler_params = set(inspect.signature(handler).parameters) - {"self", "body"}
        assert params <= handler_params, f"{role} {op_id}: handler lacks {params - handler_params}"


@pytest.mark.parametrize("role, service_cls, client_cls, table", ROLES)
def test_every_lifecycle_operation_is_in_the_spec(role, service_cls, client_cls, table):
    op_ids = {op["operationId"] for _, _, op in operations(role)}
    for name in table.operations:
        assert api_name(name) in op_ids, f"{role}: trigger {name} has no operation"


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_every_operation_documents_its_errors(role):
    for path, method, op in operations(role):
        codes = set(op["responses"])
        if op.get("security") != []:
            assert "401" in codes, f"{role} {path}: no 401"
        if method == "post" and op["operationId"] != "terminate":
            assert "409" in codes, f"{role} {path}: no 409"
        if "requestBody" in op:
            assert {"400", "413"} <= codes, f"{role} {path}: no 400/413"


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_every_operation_has_one_declared_tag(role):
    """Swagger UI groups operations by tag (all under "default" without them)."""
    declared = [tag["name"] for tag in load_spec(role)["tags"]]
    used = []
    for path, _method, op in operations(role):
        assert len(op.get("tags", [])) == 1 and op["tags"][0] in declared, (path, op.get("tags"))
        used.append(op["tags"][0])
    assert set(used) == set(declared)  # (no tag left empty)


def test_shared_schemas_are_identical_in_both_specs():
    agent, orch = load_spec("agent"), load_spec("orchestrator")
    for name in SHARED_SCHEMAS:
        assert agent["components"]["schemas"][name] == orch["components"]["schemas"][name], name
    for part in ("responses", "parameters", "securitySchemes"):
        assert agent["components"][part] == orch["components"][part], part


MODELS = {
    "agent": {
        "Status": schemas.Status,
        "ApiVersion": schemas.ApiVersion,
        "Problem": schemas.Problem,
        "FundamentalSpace": schemas.FundamentalSpace,
        "DictSpace": schemas.DictSpace,
        "AgentInitParams": schemas.AgentInitParams,
        "AgentConfig": schemas.AgentConfig,
        "EpisodeStart": schemas.EpisodeStart,
        "ActionRequest": schemas.ActionRequest,
        "ActionResponse": schemas.ActionResponse,
        "Replay": schemas.Replay,
        "StepRequest": schemas.StepRequest,
        "ColumnActions": schemas.ColumnActions,
        "PolicyCopy": schemas.PolicyCopy,
        "ReplayColumns": schemas.ReplayColumns,
        "Learned": schemas.Learned,
        "FileWritten": schemas.FileWritten,
    },
    "orchestrator": {
        "OrchestratorInitParams": schemas.OrchestratorInitParams,
        "EpisodeConfig": schemas.EpisodeConfig,
        "EpisodeResult": schemas.EpisodeResult,
        "Results": schemas.Results,
        "League": schemas.League,
        "LeagueSettings": schemas.LeagueSettings,
        "LeagueWorker": schemas.LeagueWorker,
        "LeagueWorkerJoin": schemas.LeagueWorkerJoin,
        "OrchestratorStatus": schemas.OrchestratorStatus,
        "OrchestratorProgress": schemas.OrchestratorProgress,
        "LeagueProgress": schemas.LeagueProgress,
    },
}


def spec_fields(spec_schemas: dict, schema: dict) -> set[str]:
    """A schema's properties, through allOf and $ref (an orchestrator's Status)."""
    if "$ref" in schema:
        return spec_fields(spec_schemas, spec_schemas[schema["$ref"].rsplit("/", 1)[1]])
    fields = set(schema.get("properties", {}))
    for part in schema.get("allOf", ()):
        fields |= spec_fields(spec_schemas, part)
    return fields


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_pydantic_models_have_the_spec_fields(role):
    spec_schemas = load_spec(role)["components"]["schemas"]
    for name, model in MODELS[role].items():
        wanted = spec_fields(spec_schemas, spec_schemas[name])
        model_fields = {f.alias or n for n, f in model.model_fields.items()}
        model_fields = {re.sub(r"_(\w)", lambda m: m.group(1).upper(), f) for f in model_fields}
        assert wanted == model_fields, f"{role} {name}"
    # maps and unions (the pydantic side: a type alias each, e.g. schemas.Space);
    # ThinkerSettings: the Thinker config's own snake_case keys, checked by load_config
    plain_maps = {
        "Tensor",
        "TensorMap",
        "Observation",
        "ObservationMap",
        "Observations",
        "Space",
        "ThinkerSettings",
        "Column",
        "Weights",
        "StepColumns",
    }  # (Weights: `codec.pack_arrays`; StepColumns: `wire.step_columns`, below)
    assert not set(spec_schemas) - set(MODELS[role]) - plain_maps - set(MODELS["agent"]), (
        "a spec schema has no model"
    )


def test_the_step_contract_has_the_spec_fields():
    """stepColumns' body, as `mistk_rl.wire.step_columns` builds and reads it, is the spec's
    StepColumns: the same fields, its reset's too."""
    schema = load_spec("agent")["components"]["schemas"]["StepColumns"]
    assert set(schema["properties"]) == step_columns.body_fields()
    assert set(schema["properties"]["reset"]["properties"]) == set(step_columns.RESET_FIELDS)
    assert schema["additionalProperties"] is False


def test_league_player_entries_have_the_spec_fields():
    """LeagueSettings' players items (inline in the spec) are LeaguePlayerSpec's fields."""
    items = load_spec("orchestrator")["components"]["schemas"]["LeagueSettings"]["properties"][
        "players"
    ]["items"]
    fields = {f.alias or n for n, f in schemas.LeaguePlayerSpec.model_fields.items()}
    assert set(items["properties"]) == fields
    assert items["additionalProperties"] is False


def test_an_orchestrators_status_payload_is_typed():
    """The status long-poll answers an OrchestratorStatus; what the league and the harness
    read from it (agentSteps, episodesDone, the league's counts) are declared fields."""
    spec = load_spec("orchestrator")
    answer = spec["paths"]["/status"]["get"]["responses"]["200"]["content"]["application/json"]
    assert answer["schema"] == {"$ref": "#/components/schemas/OrchestratorStatus"}
    status = schemas.OrchestratorStatus.model_validate(
        {
            "state": "running",
            "resourceVersion": 3,
            "payload": {
                "agentSteps": {"main": 7},
                "episodesDone": 2,
                "envSteps": 12,
                "other": 1,
                "league": {"jobs": 3, "failed": 1, "workers": 2},
            },
        }
    )
    assert status.payload.agent_steps == {"main": 7} and status.payload.episodes_done == 2
    assert status.payload.league.failed == 1 and status.payload.model_extra == {"other": 1}
