"""The conformance kit: checks any agent or orchestrator service, in any language, against
the contract (the OpenAPI specs and the lifecycle tables), and says what failed and why."""

from mistk_rl.conformance.agent_suite import AgentSuite
from mistk_rl.conformance.report import Check, Report

__all__ = ["AgentSuite", "Check", "Report", "check_agent"]


def check_agent(url: str, **options: object) -> Report:
    """Run the agent checks against the agent service at `url` (its root or base path);
    options: token, env (a gymnasium id, CartPole-v1), timeout, wait, terminate."""
    return AgentSuite(url, **options).run()  # type: ignore[arg-type]
