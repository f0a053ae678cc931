"""A served agent as a policy object of the gymnasium / Stable-Baselines3 world.

`ServedPolicy` has SB3's ``predict(observation, state=None, episode_start=None,
deterministic=True) -> (actions, state)``, so whatever calls a model's ``predict`` (SB3's
``evaluate_policy``, a hand-written gymnasium loop, a video recorder) can act with an agent
running anywhere: each call is one ``getAction`` for the batch, one entity per env copy
(``env0``, ``env1``, ...). The agent needs its model built (state ``ready``, or already
registered); the first call registers it with the env's spaces and starts an episode in
``eval`` mode (greedy) when `deterministic`, else ``collect`` (exploring: the agent's own
sampling). Nothing is learned: no transitions are sent back. `close` ends the episode.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.sdk.client import AgentClient
from mistk_rl.spaces import space_to_dict


class ServedPolicy:
    """`client`'s agent acting in `observation_space` / `action_space` (module doc)."""

    def __init__(
        self,
        client: AgentClient,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        name: str = "policy",
    ) -> None:
        self.client, self.name = client, name
        self.observation_space, self.action_space = observation_space, action_space
        self._registered = False
        self._episode: Optional[tuple[str, int]] = None  # (mode, env copies) of the episode

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        """Actions for a batch of observations ([n_envs, *shape], or a dict of those), or
        for one observation; `state` is passed back as it came (no recurrent state here),
        `episode_start` is not needed (the agent acts on each observation alone)."""
        single = self._single(observation)
        batch = (
            _map(lambda x: np.asarray(x)[None], observation)
            if single
            else _map(np.asarray, observation)
        )
        n = len(next(iter(batch.values())) if isinstance(batch, dict) else batch)
        obs = {f"env{i}": _map(lambda x, i=i: x[i], batch) for i in range(n)}
        self._ensure_episode("eval" if deterministic else "collect", obs)
        answer = self.client.get_action(obs)
        actions = np.asarray([answer[f"env{i}"] for i in range(n)])
        return (actions[0] if single else actions), state

    def close(self) -> None:
        """End the episode the policy started (the agent is ``ready`` again)."""
        if self._episode is not None:
            self.client.episode_stopped()
            self._episode = None

    def __enter__(self) -> "ServedPolicy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _single(self, observation: Any) -> bool:
        """Whether `observation` is one observation rather than a batch of them."""
        space = self.observation_space
        if isinstance(space, spaces.Dict):
            key = next(iter(space.spaces))
            return np.shape(observation[key]) == space.spaces[key].shape
        return np.shape(observation) == space.shape

    def _ensure_episode(self, mode: str, obs: dict[str, Any]) -> None:
        if not self._registered:
            self.client.agent_registered(
                {
                    "name": self.name,
                    "observationSpace": space_to_dict(self.observation_space),
                    "actionSpace": space_to_dict(self.action_space),
                }
            )
            self._registered = True
        if self._episode != (mode, len(obs)):  # (another mode or batch size: a new episode)
            self.close()
            self.client.episode_started(obs, mode=mode)
            self._episode = (mode, len(obs))


def _map(fn, value: Any) -> Any:
    """`fn` on an array, or on each array of a dict observation."""
    return {k: fn(v) for k, v in value.items()} if isinstance(value, dict) else fn(value)
