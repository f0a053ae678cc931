"""The app factory: one service behind the serving pipeline, connexion for the docs.

`create_app(service)` loads ``mistk_rl/openapi/<role>.yaml`` and puts `ServicePipeline`
(``pipeline.py``), the outermost ASGI layer, in front of a connexion app of the same spec. The
pipeline serves every operation the spec names (token, size limit, decoding, validation,
problem+json, thread pools: one place for every rule); connexion serves what is left: the
Swagger UI at ``<base path>/ui/``, the spec as ``openapi.json``, and 404/405 problems for
anything else.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from importlib import resources
from typing import Any, Optional, Union

import yaml
from connexion import FlaskApp
from connexion.options import SwaggerUIOptions
from connexion.resolver import Resolver

# (imported for their registries, which the specs' enums name)
import mistk_rl.games.opponents
import mistk_rl.league.player  # noqa: F401
from mistk_rl.limits import Limits
from mistk_rl.registry import Registry
from mistk_rl.service.handlers import AgentService, OrchestratorService
from mistk_rl.service.pipeline import ServicePipeline

BASE_PATHS = {"agent": "/v1/mistk/agent", "orchestrator": "/v1/mistk/orchestrator"}


@lru_cache(maxsize=None)
def load_spec(role: str) -> dict[str, Any]:
    """The role's OpenAPI document (packaged as `mistk_rl.openapi`), its registry enums
    filled in (`fill_registry_enums`)."""
    text = resources.files("mistk_rl.openapi").joinpath(f"{role}.yaml").read_text()
    return fill_registry_enums(yaml.safe_load(text))


def fill_registry_enums(node: Any) -> Any:
    """Every schema marked ``x-mistk-registry: NAME`` gets ``enum``: the names registered in
    that registry (`mistk_rl.registry`), so an extension point is declared once, next to its
    code, and the served spec, the Swagger UI and the request validation all follow it."""
    if isinstance(node, dict):
        if "x-mistk-registry" in node:
            node["enum"] = Registry.named(node["x-mistk-registry"]).names()
        for value in node.values():
            fill_registry_enums(value)
    elif isinstance(node, list):
        for value in node:
            fill_registry_enums(value)
    return node


def create_app(
    service: Union[AgentService, OrchestratorService],
    *,
    token: Optional[str] = None,
    limits: Limits = Limits(),
) -> ServicePipeline:
    """The ASGI app of one service: `ServicePipeline` first, connexion behind it.

    The pipeline is the outermost layer, not a middleware inside connexion's stack: the spec's
    operations skip connexion's and starlette's wrappers (~5 us of the ~55 us a getAction
    costs in the server), and anything the pipeline does not route (the docs, unknown paths,
    the lifespan events) goes on to connexion as before."""
    spec = copy.deepcopy(load_spec(service.role))
    if not token:  # no token configured: the operations are open (loopback by default)
        spec.pop("security", None)
    base_path = BASE_PATHS[service.role]
    docs = FlaskApp(__name__)
    # connexion keeps the routes only to serve the docs (its own security and validation are
    # never reached: the pipeline answers every operation before connexion sees it)
    docs.add_api(
        spec,
        base_path=base_path,
        resolver=Resolver(lambda operation_id: getattr(service, operation_id)),
        swagger_ui_options=SwaggerUIOptions(swagger_ui=True, swagger_ui_path="/ui"),
    )
    return ServicePipeline(
        docs, service=service, spec=spec, base_path=base_path, token=token, limits=limits
    )
