"""The packaged contract as the kit reads it: each operation's method and path, the answers
it documents, and a JSON Schema check of every answer against its response schema.

OpenAPI 3.0 schemas are JSON Schema draft 4 plus ``nullable``; that one keyword is rewritten
(a schema that may also be null) and the rest is checked by `jsonschema` as it stands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Mapping, Optional

import yaml
from jsonschema import Draft4Validator

METHODS = ("get", "put", "post", "delete", "patch")
JSON = "application/json"
PROBLEM = "application/problem+json"


@dataclass(frozen=True)
class SpecOperation:
    """One operation of the spec: how to call it and what it may answer."""

    operation_id: str
    method: str
    path: str
    responses: Mapping[str, Any]  # status (or "default") -> response object, refs resolved
    secured: bool  # needs the bearer token when the service has one

    def documented(self, status: int) -> Optional[Mapping[str, Any]]:
        return self.responses.get(str(status)) or self.responses.get("default")


def _nullable(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable: true`` as JSON Schema: the schema, or null."""
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _nullable(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


class Contract:
    """One role's packaged spec (``agent`` or ``orchestrator``)."""

    def __init__(self, role: str) -> None:
        text = resources.files("mistk_rl.openapi").joinpath(f"{role}.yaml").read_text()
        self.role = role
        self.spec: dict[str, Any] = yaml.safe_load(text)
        self.version: str = self.spec["info"]["version"]
        self.base_path: str = self.spec["servers"][0]["url"]
        self._components = _nullable(self.spec.get("components", {}))
        default_security = self.spec.get("security", [])
        self.operations: dict[str, SpecOperation] = {}
        for path, item in self.spec["paths"].items():
            for method in METHODS:
                if method not in item:
                    continue
                op = item[method]
                self.operations[op["operationId"]] = SpecOperation(
                    operation_id=op["operationId"],
                    method=method.upper(),
                    path=path,
                    responses={k: self._resolve(v) for k, v in op["responses"].items()},
                    secured=bool(op.get("security", default_security)),
                )

    def _resolve(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        """A ``$ref`` to a component, followed (responses and parameters are refs here)."""
        while "$ref" in node:
            where = node["$ref"].removeprefix("#/").split("/")
            found: Any = self.spec
            for part in where:
                found = found[part]
            node = found
        return node

    def answer_problems(
        self, operation_id: str, status: int, content_type: str, body: bytes
    ) -> list[str]:
        """Why this answer breaks the contract (nothing: it keeps it): an undocumented
        status, a content type the response does not list, a body its schema refuses."""
        op = self.operations[operation_id]
        response = op.documented(status)
        if response is None:
            listed = ", ".join(sorted(op.responses))
            return [f"{operation_id} does not document status {status} (it lists {listed})"]
        content = response.get("content")
        if not content:
            return []
        media = content_type.split(";")[0].strip().lower()
        if media not in content:
            return [
                f"{operation_id} {status} answered Content-Type {media or '(none)'}; "
                f"the spec lists {', '.join(content)}"
            ]
        schema = content[media].get("schema")
        if schema is None or media not in (JSON, PROBLEM):
            return []
        try:
            value = json.loads(body or b"null")
        except ValueError as exc:
            return [f"{operation_id} {status}: the body is not JSON ({exc})"]
        return [
            f"{operation_id} {status}: {_where(error.absolute_path)}{error.message}"
            for error in self.validator(json.dumps(schema, sort_keys=True)).iter_errors(value)
        ][:5]

    @cache  # noqa: B019 (a contract lives as long as the process; few distinct schemas)
    def validator(self, schema_json: str) -> Draft4Validator:
        root = {"components": self._components, "allOf": [_nullable(json.loads(schema_json))]}
        return Draft4Validator(root)

    def schema_problems(self, component: str, value: Any) -> list[str]:
        """`value` against ``#/components/schemas/<component>``."""
        ref = json.dumps({"$ref": f"#/components/schemas/{component}"})
        return [
            f"{component}: {_where(e.absolute_path)}{e.message}"
            for e in self.validator(ref).iter_errors(value)
        ][:5]


def _where(path: Any) -> str:
    parts = "/".join(str(p) for p in path)
    return f"at {parts}: " if parts else ""


@cache
def contract(role: str) -> Contract:
    return Contract(role)
