"""ThinkerPlannerAgent: the scripted planner of `mistk_rl.thinker.planner` as an agent service.

Registered with a Thinker orchestrator's spaces (observation ``{"tree_reps", ...}``, action
Discrete(2A) or MultiDiscrete([A, 2])), it imagines at random and takes the root child with
the best return found. It learns nothing: what it solves is the signal the tree carries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.files import atomic_write_json
from mistk_rl.framework.agent import AbstractAgent, Observations, saved_seed, seed_hyperparameter
from mistk_rl.thinker.planner import plan


class ThinkerPlannerAgent(AbstractAgent):
    """Hyperparameters: ``seed`` (int, optional) for the random imagination."""

    def __init__(self) -> None:
        super().__init__()
        self.seed: Optional[int] = None
        self.rng = np.random.default_rng()
        self.num_actions = 0

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        self.seed = seed_hyperparameter(hparams)

    def do_build_model(self, path: Optional[Path]) -> None:
        self.seed = saved_seed(path, self.seed)
        self.rng = np.random.default_rng(self.seed)

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
        if not (
            isinstance(observation_space, spaces.Dict) and "tree_reps" in observation_space.spaces
        ):
            raise InvalidRequest(
                "ThinkerPlannerAgent plays the Thinker MDP: its observation "
                "space is a Dict with tree_reps"
            )
        if isinstance(action_space, spaces.Discrete) and action_space.n % 2 == 0:
            return
        if isinstance(action_space, spaces.MultiDiscrete) and list(action_space.nvec)[1:] == [2]:
            return
        raise InvalidRequest(
            f"ThinkerPlannerAgent acts in Discrete(2A) or MultiDiscrete([A, 2]), not {action_space}"
        )

    def do_agent_registered(self, config: dict[str, Any]) -> None:
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            self.num_actions = int(space.n) // 2
        else:
            assert isinstance(space, spaces.MultiDiscrete)  # (validate_registration's two)
            self.num_actions = int(space.nvec[0])

    def do_get_action(
        self, obs: Observations, action_mask: Optional[Observations] = None
    ) -> dict[str, Any]:
        entities = list(obs)
        reps = np.stack([np.asarray(obs[e]["tree_reps"], dtype=np.float32) for e in entities])
        primary, reset = plan(reps, self.num_actions, self.rng)
        if isinstance(self.action_space, spaces.Discrete):
            return {e: int(r * self.num_actions + p) for e, p, r in zip(entities, primary, reset)}
        return {e: [int(p), int(r)] for e, p, r in zip(entities, primary, reset)}

    def do_save_model(self, path: Path) -> None:
        atomic_write_json(path, {"agent": "ThinkerPlannerAgent", "seed": self.seed})
