"""The conformance kit: checks any agent or orchestrator service, in any language, against
the contract (the OpenAPI specs and the lifecycle tables), and says what failed and why."""

from mistk_rl.conformance.agent_suite import AgentSuite
from mistk_rl.conformance.orchestrator_suite import OrchestratorSuite
from mistk_rl.conformance.report import Check, Report

__all__ = [
    "AgentSuite",
    "Check",
    "OrchestratorSuite",
    "Report",
    "check_agent",
    "check_orchestrator",
]


def check_agent(url: str, **options: object) -> Report:
    """Run the agent checks against the agent service at `url` (its root or base path);
    options: token, env (a gymnasium id, CartPole-v1), timeout, wait, terminate."""
    return AgentSuite(url, **options).run()  # type: ignore[arg-type]


def check_orchestrator(url: str, **options: object) -> Report:
    """Run the orchestrator checks against the orchestrator at `url`, with the kit's own
    agent (or `agent_url`'s); options: token, env (an env id it makes), agent_url, timeout,
    wait, terminate."""
    return OrchestratorSuite(url, **options).run()  # type: ignore[arg-type]
