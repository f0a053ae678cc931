"""Operation handlers: one method per operationId in the spec, bound to one implementation.

A handler turns the validated request into the implementation's terms (numpy arrays, paths
inside the data dir), checks what the spec cannot (so bad input is refused before any state
change), and hands the hook to the `Lifecycle`, which fires the triggers. They are plain
methods, so tests can drive a service in-process without HTTP. A module per service
(`agent`, `orchestrator`), over what both share (`common`).
"""

from mistk_rl.service.handlers.agent import AgentService
from mistk_rl.service.handlers.orchestrator import OrchestratorService, refuse_unknown_options

__all__ = ["AgentService", "OrchestratorService", "refuse_unknown_options"]
