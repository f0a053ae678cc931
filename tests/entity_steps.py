"""Drive an agent's hooks with entity-keyed dicts, in-process, as its service does.

The service keeps what an agent acted on under step ids (`mistk_rl.service.steps`) and hands
it back with each transition; tests that play an agent without HTTP do the same here."""

from __future__ import annotations

from typing import Any, Optional

from mistk_rl.framework.agent import AbstractAgent, ReplayBatch
from mistk_rl.service.steps import StepStore, entity_acting, entity_transitions


class EntitySteps:
    def __init__(self, agent: AbstractAgent) -> None:
        self.agent = agent
        self.store = StepStore()

    def get_action(
        self, obs: dict[str, Any], action_mask: Optional[dict[str, Any]] = None
    ) -> dict[str, Any]:
        acting = entity_acting(obs, action_mask)
        acted = self.agent.do_act(acting)
        self.store.put(acting.obs, acted, acting.names)
        return dict(zip(acting.names, acted.actions.tolist()))

    def replay_action(self, batch: ReplayBatch) -> None:
        transitions = entity_transitions(batch, self.store)
        rest = self.agent.do_learn(transitions)
        if rest is not None:  # (what the service runs after a step's answer)
            rest()
        self.store.forget(transitions.names)
