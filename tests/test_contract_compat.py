"""The packaged contracts stay compatible with the last released ones
(contracts/released/ROLE-VERSION.yaml) unless their major version moves; the checker finds
each kind of breaking change; the SDK refuses a service of another major version."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from mistk_rl import API_VERSION
from mistk_rl.openapi.compat import breaking_changes, check
from mistk_rl.sdk.client import AgentClient, IncompatibleService

REPO = Path(__file__).resolve().parent.parent
RELEASED = REPO / "contracts" / "released"


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in path.stem.split("-")[-1].split("."))


def last_released(role: str) -> dict[str, Any]:
    copies = sorted(RELEASED.glob(f"{role}-*.yaml"), key=_version_key)
    assert copies, f"no released {role} contract under {RELEASED}"
    return yaml.safe_load(copies[-1].read_text())


def packaged(role: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "mistk_rl" / "openapi" / f"{role}.yaml").read_text())


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_the_packaged_contract_keeps_the_released_one(role: str) -> None:
    assert check(last_released(role), packaged(role)) == []


@pytest.mark.parametrize("role", ["agent", "orchestrator"])
def test_the_package_speaks_the_version_its_contracts_say(role: str) -> None:
    assert packaged(role)["info"]["version"] == API_VERSION


def _schemas(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["components"]["schemas"]


Change = Callable[[dict[str, Any]], None]
BREAKING: dict[str, tuple[Change, str]] = {
    "an operation removed": (lambda s: s["paths"].pop("/replayAction"), "operation removed"),
    "a request field removed": (
        lambda s: _schemas(s)["EpisodeStart"]["properties"].pop("epsilon"),
        "field 'epsilon' removed",
    ),
    "an answer field removed": (
        lambda s: _schemas(s)["Status"]["properties"].pop("instance"),
        "field 'instance' removed",
    ),
    "an answer field no longer required": (
        lambda s: _schemas(s)["Status"]["required"].remove("payload"),
        "field 'payload' no longer always answered",
    ),
    "an enum value removed": (
        lambda s: _schemas(s)["EpisodeStart"]["properties"]["mode"]["enum"].remove("eval"),
        "enum value 'eval' removed",
    ),
    "a new required field": (
        lambda s: _schemas(s)["AgentConfig"]["required"].append("train"),
        "new required field 'train'",
    ),
    "a narrowed type": (
        lambda s: _schemas(s)["AgentConfig"]["properties"].__setitem__("train", {"type": "string"}),
        "type changed from boolean to string",
    ),
    "a tightened bound": (
        lambda s: _schemas(s)["EpisodeStart"]["properties"]["epsilon"].__setitem__("maximum", 0.5),
        "maximum lowered to 0.5",
    ),
    "a new required parameter": (
        lambda s: s["paths"]["/buildModel"]["post"]["parameters"][0].__setitem__("required", True),
        "parameter modelPath: now required",
    ),
    "a request content type dropped": (
        lambda s: s["paths"]["/getAction"]["post"]["requestBody"]["content"].pop(
            "application/vnd.mistk.tensors"
        ),
        "content type no longer accepted",
    ),
}


@pytest.mark.parametrize("kind", sorted(BREAKING))
def test_each_kind_of_breaking_change_is_found(kind: str) -> None:
    change, said = BREAKING[kind]
    old = packaged("agent")
    new = copy.deepcopy(old)
    change(new)
    problems = check(old, new)
    assert problems and any(said in p for p in problems), problems
    new["info"]["version"] = "2.0.0"  # the same change is allowed with a new major version
    assert check(old, new) == []
    assert breaking_changes(old, new)  # (and still listed, for the release notes)


def test_additions_are_compatible() -> None:
    old = packaged("agent")
    new = copy.deepcopy(old)
    new["paths"]["/newThing"] = {
        "get": {"operationId": "newThing", "responses": {"200": {"description": "ok"}}}
    }
    _schemas(new)["EpisodeStart"]["properties"]["note"] = {"type": "string"}
    _schemas(new)["Status"]["properties"]["extra"] = {"type": "string"}
    _schemas(new)["EpisodeStart"]["properties"]["mode"]["enum"].append("replay")
    assert check(old, new) == []


def test_a_version_going_backwards_is_refused() -> None:
    old, new = packaged("agent"), packaged("agent")
    old["info"]["version"] = "2.0.0"
    assert any("older" in p for p in check(old, new))


def test_the_sdk_refuses_another_major_version(monkeypatch) -> None:
    client = AgentClient("http://127.0.0.1:9")
    answers = {"version": "2.1.0", "role": "agent", "capabilities": []}
    monkeypatch.setattr(client, "_call", lambda method, path, **kw: answers)
    with pytest.raises(IncompatibleService, match="speaks contract 2.1.0; this SDK speaks 1"):
        client.api_version()
    answers["version"] = "1.7.0"  # a newer minor version is compatible
    assert client.api_version().version == "1.7.0"
    client.close()
