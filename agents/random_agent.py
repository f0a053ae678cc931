"""RandomAgent: samples the registered action space, honouring action masks.

A baseline and a smoke test for the whole service stack: it needs no model, so its
"checkpoint" is just its settings, saved as JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.files import atomic_write_json
from mistk_rl.framework.agent import (
    AbstractAgent,
    Acted,
    Acting,
    Observations,
    saved_seed,
    seed_hyperparameter,
)
from mistk_rl.framework.implementation import PROGRESS_EVERY_S


class RandomAgent(AbstractAgent):
    """Hyperparameters: ``seed`` (int, optional) for reproducible actions."""

    def __init__(self) -> None:
        super().__init__()
        self.seed: Optional[int] = None
        self.actions_taken = 0

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        self.seed = seed_hyperparameter(hparams)

    def do_build_model(self, path: Optional[Path]) -> None:
        self.seed = saved_seed(path, self.seed)  # a saved RandomAgent: restore its seed
        self.actions_taken = 0

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
        if action_space is None:
            raise InvalidRequest(f"{type(self).__name__} needs an actionSpace at registration")

    def do_agent_registered(self, config: dict[str, Any]) -> None:
        self._registered_space().seed(self.seed)

    def do_get_action(
        self, obs: Observations, action_mask: Optional[Observations] = None
    ) -> dict[str, Any]:
        space = self._registered_space()
        masks = action_mask or {}
        actions = {}
        for entity in obs:
            mask = masks.get(entity)
            actions[entity] = self._sample(space, None if mask is None else np.asarray(mask))
        self.actions_taken += len(actions)
        self.update_status({"actionsTaken": self.actions_taken}, every_s=PROGRESS_EVERY_S)
        return actions

    def do_act(self, batch: Acting) -> Acted:
        """All rows at once for a Discrete space (with masks: uniform over each row's legal
        actions); other spaces row by row, as `do_get_action`."""
        space = self.action_space
        if not isinstance(space, spaces.Discrete):
            return super().do_act(batch)
        rng, n = space.np_random, len(batch)
        if batch.action_mask is None:  # (one row: a scalar draw, the same stream, 3x faster)
            actions = (
                rng.integers(0, space.n, size=n) if n > 1 else np.array([rng.integers(0, space.n)])
            ) + int(space.start)
        else:
            mask = batch.action_mask.reshape(n, -1)
            if not mask.any(axis=1).all():
                raise ValueError("action mask allows no action")
            actions = np.where(mask, rng.random(mask.shape), -1.0).argmax(axis=1) + int(space.start)
        self.actions_taken += n
        self.update_status({"actionsTaken": self.actions_taken}, every_s=PROGRESS_EVERY_S)
        return Acted(actions)

    def _registered_space(self) -> spaces.Space:
        if self.action_space is None:
            raise RuntimeError("no action space: register the agent first")
        return self.action_space

    @staticmethod
    def _sample(space: spaces.Space, mask: Optional[np.ndarray]) -> Any:
        if mask is None:
            return space.sample()
        if isinstance(space, spaces.Discrete):
            mask = mask.astype(np.int8).reshape(-1)
            if mask.shape != (space.n,):
                raise ValueError(f"action mask of shape {mask.shape} for Discrete({space.n})")
            if not mask.any():
                raise ValueError("action mask allows no action")
            return space.sample(mask=mask)
        if isinstance(space, spaces.MultiDiscrete):
            rows = tuple(np.asarray(m, dtype=np.int8) for m in mask)
            return space.sample(mask=rows)
        raise ValueError(f"action masks are supported for Discrete and MultiDiscrete, not {space}")

    def do_save_model(self, path: Path) -> None:
        atomic_write_json(
            path, {"agent": "RandomAgent", "seed": self.seed, "actionsTaken": self.actions_taken}
        )
