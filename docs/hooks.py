"""MkDocs hook: the pages drawn from the code, made at build time so they cannot go stale.

- ``concepts/*-lifecycle.svg``: the two lifecycles as a caller sees them
  (`mistk_rl.lifecycle.diagram.svg`, from the transition tables);
- ``reference/http-api.md``: every operation, parameter, response and schema of the two
  OpenAPI contracts the services are routed from;
- ``reference/configs.md``: every key of the harness's YAML config with its type and default
  (from the pydantic models), and the DQN, PPO and Thinker settings with their defaults.
"""

from __future__ import annotations

import inspect
import re
from importlib import resources
from typing import Any, get_args, get_origin

import yaml
from mkdocs.structure.files import File, Files
from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def on_files(files: Files, config: Any) -> Files:
    from mistk_rl.lifecycle.diagram import svg
    from mistk_rl.lifecycle.tables import AGENT, ORCHESTRATOR

    for table in (AGENT, ORCHESTRATOR):
        files.append(
            File.generated(config, f"concepts/{table.role}-lifecycle.svg", content=svg(table))
        )
    files.append(File.generated(config, "reference/http-api.md", content=http_api_page()))
    files.append(File.generated(config, "reference/configs.md", content=configs_page()))
    return files


# -- the HTTP API, from the specs ------------------------------------------------------------


def _spec(name: str) -> dict:
    return yaml.safe_load(resources.files("mistk_rl.openapi").joinpath(name).read_text())


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _schema_text(schema: dict) -> str:
    """A schema in a few words: its $ref (linked), type, format and bounds."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{name.lower()})"
    if "oneOf" in schema or "anyOf" in schema:
        return " or ".join(_schema_text(s) for s in schema.get("oneOf", schema.get("anyOf")))
    kind = schema.get("type", "any")
    if kind == "array":
        kind = f"array of {_schema_text(schema.get('items', {}))}"
    bounds = [
        f"{key} {schema[key]}"
        for key in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems")
        if key in schema
    ]
    if "enum" in schema:
        bounds.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    if "default" in schema:
        bounds.append(f"default `{schema['default']}`")
    if schema.get("nullable"):
        bounds.append("nullable")
    return kind + (f" ({'; '.join(bounds)})" if bounds else "")


def _one_line(text: str | None) -> str:
    """`text` on one line for a table cell: pipes escaped, and outside code spans brackets
    (a regex's ``[A-Z]`` would read as a Markdown link) and angle brackets (``<name>``
    would read as an HTML tag)."""
    parts = " ".join((text or "").split()).replace("|", "\\|").split("`")
    return "`".join(_plain(part) if i % 2 == 0 else part for i, part in enumerate(parts))


def _plain(text: str) -> str:
    for char, escaped in (("[", "\\["), ("]", "\\]"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(char, escaped)
    return text


def _operation(spec: dict, path: str, method: str, op: dict) -> list[str]:
    base = spec["servers"][0]["url"]
    lines = [
        f"### {op['operationId']}",
        "",
        f"`{method.upper()} {base}{path}` · tag `{', '.join(op.get('tags', []))}`",
        "",
        _one_line(op.get("summary")),
        "",
    ]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    params = [
        spec["components"]["parameters"][_ref_name(p["$ref"])] if "$ref" in p else p
        for p in op.get("parameters", [])
    ]
    if params:
        lines += [
            "| parameter | in | required | schema | what |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} | "
            f"{_schema_text(p.get('schema', {}))} | {_one_line(p.get('description'))} |"
            for p in params
        ]
        lines.append("")
    body = op.get("requestBody")
    if body:
        kinds = ", ".join(
            f"`{media}`: {_schema_text(c.get('schema', {}))}"
            for media, c in body.get("content", {}).items()
        )
        lines += [f"Body{' (required)' if body.get('required') else ''}: {kinds}", ""]
    lines += ["| status | what |", "| --- | --- |"]
    for status, response in op.get("responses", {}).items():
        if "$ref" in response:
            response = spec["components"]["responses"][_ref_name(response["$ref"])]
        lines.append(f"| {status} | {_one_line(response.get('description'))} |")
    return lines + [""]


def _schemas(spec: dict) -> list[str]:
    lines = []
    for name, schema in sorted(spec["components"]["schemas"].items()):
        lines += [f"### {name}", "", _one_line(schema.get("description")), ""]
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            lines += ["| field | schema | required | what |", "| --- | --- | --- | --- |"]
            lines += [
                f"| `{field}` | {_schema_text(sub)} | {'yes' if field in required else ''}"
                f" | {_one_line(sub.get('description'))} |"
                for field, sub in props.items()
            ]
        else:
            lines.append(_schema_text(schema))
        lines.append("")
    return lines


def http_api_page() -> str:
    lines = [
        "# HTTP API",
        "",
        "Generated from the OpenAPI contracts the services are routed from "
        "(`mistk_rl/openapi/agent.yaml`, `mistk_rl/openapi/orchestrator.yaml`); a running "
        "service serves the same as Swagger UI at `<base path>/ui/` and the spec at "
        "`<base path>/openapi.json`. Errors are `application/problem+json` "
        "(`title`, `detail`, `status`).",
        "",
    ]
    for name in ("agent.yaml", "orchestrator.yaml"):
        spec = _spec(name)
        lines += [
            f"## {spec['info']['title']} (API {spec['info']['version']})",
            "",
            _one_line(spec["info"].get("description")),
            "",
        ]
        for tag in spec.get("tags", []):
            ops = [
                (path, method, op)
                for path, methods in spec["paths"].items()
                for method, op in methods.items()
                if tag["name"] in op.get("tags", [])
            ]
            if not ops:
                continue
            lines += [f"**{tag['name']}**: {_one_line(tag.get('description'))}", ""]
            for path, method, op in ops:
                lines += _operation(spec, path, method, op)
        lines += [f"## {spec['info']['title']}: schemas", ""] + _schemas(spec)
    return "\n".join(lines)


# -- the configs, from the models ------------------------------------------------------------


def _field_comments(model: type) -> dict[str, str]:
    """The comment on a field's line or on the lines just above it, in the model's source:
    the config models say what a key is for in comments, where a reader of the code sees them."""
    notes: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        found = re.match(r"(\w+): [^=]+(?:=.*)?$", stripped)
        if found and not stripped.startswith(("def ", "return")):
            trailing = line.split("  # ", 1)[1] if "  # " in line else ""
            notes[found.group(1)] = " ".join(above + ([trailing] if trailing else []))
        above = []
    return notes


def _type_text(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    text = str(annotation).replace("typing.", "")
    return re.sub(r"[\w.]+\.(\w+)", r"\1", text)


def _default_text(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(its defaults)"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def config_rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, what) for every key of `model`, nested models included
    (a list of models as ``key[].sub``)."""
    from harness.config import model_in

    rows = []
    notes = {}
    for cls in reversed(model.__mro__):  # a subclass's comment wins over its base's
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            try:
                notes.update(_field_comments(cls))
            except (OSError, TypeError):
                pass
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = model_in(field.annotation)
        what = (
            field.description
            or notes.get(name)
            or ((nested.__doc__ or "").split("\n\n")[0] if nested is not None else "")
        )
        rows.append((key, _type_text(field.annotation), _default_text(field), what or ""))
        if nested is not None:
            listed = get_origin(field.annotation) is list or any(
                get_origin(arg) is list for arg in get_args(field.annotation)
            )
            rows += config_rows(nested, f"{key}[]." if listed else f"{key}.")
    return rows


def configs_page() -> str:
    from agents.dqn_agent import DQNAgent
    from agents.ppo_agent import PPOAgent
    from agents.thinker_agent import ThinkerPPOAgent
    from harness.config import RunConfig
    from mistk_rl.thinker.config import ThinkerConfig

    lines = [
        "# Configs",
        "",
        "Generated from the code at build time. A key that is not listed is an error "
        'that names it and the closest known key ("Did you mean ...?"), in the harness '
        "config and in an agent's hyperparameters alike.",
        "",
        "## The harness config (`mistk-rl run CONFIG.yaml`)",
        "",
        f"{_one_line(RunConfig.__doc__)} Examples: `configs/`.",
        "",
        "| key | type | default | what |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| `{key}` | `{kind}` | {default} | {_one_line(what)} |"
        for key, kind, default, what in config_rows(RunConfig)
    ]
    lines += [
        "",
        "## Agent hyperparameters",
        "",
        "An agent's `hyperparameters` (the harness config's `agents[].hyperparameters`, "
        "or initialize's `objectives` ... `hyperparameters` over HTTP) merge over these "
        "defaults key by key.",
        "",
    ]
    for agent in (DQNAgent, PPOAgent, ThinkerPPOAgent):
        lines += [
            f"### {agent.__name__} (`agents.{agent.__module__.split('.')[-1]}:{agent.__name__}`)",
            "",
            "```yaml",
            yaml.safe_dump(agent.default_config(), sort_keys=False).rstrip(),
            "```",
            "",
        ]
    notes = _field_comments(ThinkerConfig)
    lines += [
        "## Thinker (`env.thinker` of a gym orchestrator)",
        "",
        "The Thinker-augmented MDP's settings; the keys keep the names of the Thinker "
        "paper's `default_thinker.yaml`.",
        "",
        "| key | default | what |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| `{name}` | `{value}` | {_one_line(notes.get(name))} |"
        for name, value in vars(ThinkerConfig()).items()
    ]
    return "\n".join(lines) + "\n"
