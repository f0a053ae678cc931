"""The agent the kit brings to check an orchestrator with: it acts uniformly at random
(within action masks) and reports, in its status payload, what the orchestrator made it do,
so the kit can compare that with the results the orchestrator gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.files import atomic_write_json
from mistk_rl.framework.agent import AbstractAgent, Acted, Acting, EpisodeInfo, Transitions


class PairAgent(AbstractAgent):
    def __init__(self) -> None:
        super().__init__()
        self.counts = {"episodesStarted": 0, "episodesStopped": 0, "actions": 0, "learned": 0}
        self.rng = np.random.default_rng(0)

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
        if action_space is None:
            raise InvalidRequest("the conformance agent needs an actionSpace")

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n
        self.update_status(dict(self.counts))

    def do_episode_started(self, episode: EpisodeInfo) -> None:
        self._count("episodesStarted")

    def do_act(self, batch: Acting) -> Acted:
        space = self.action_space
        assert space is not None  # (registered: the lifecycle allows no step before)
        n = len(batch)
        if isinstance(space, spaces.Discrete) and batch.action_mask is not None:
            mask = batch.action_mask.reshape(n, -1).astype(bool)
            picks = np.where(mask, self.rng.random(mask.shape), -1.0).argmax(axis=1)
            actions = picks + int(space.start)
        else:
            actions = np.asarray([space.sample() for _ in range(n)])
        self._count("actions", n)
        return Acted(actions)

    def do_learn(self, transitions: Transitions) -> Optional[Callable[[], None]]:
        self._count("learned", len(transitions.actions))
        return None

    def do_episode_stopped(self) -> None:
        self._count("episodesStopped")

    def do_reset(self, unload_model: bool) -> None:
        self.counts = dict.fromkeys(self.counts, 0)

    def do_save_model(self, path: Path) -> None:
        atomic_write_json(path, {"agent": "PairAgent", **self.counts})

    def do_agent_registered(self, config: dict[str, Any]) -> None:
        self.update_status(dict(self.counts))
