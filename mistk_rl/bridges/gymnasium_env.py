"""An orchestrator's env copies as a `gymnasium.Env` and a `gymnasium.vector.VectorEnv`:
the caller drives the loop (SB3, CleanRL, ...), as RLlib's ExternalEnv inverts control.

    import gymnasium as gym
    import mistk_rl.bridges.gymnasium_env  # registers the id
    env = gym.make("mistk_rl/Orchestrator-v0", env={"id": "CartPole-v1"})        # one copy
    envs = gym.make_vec("mistk_rl/Orchestrator-v0", num_envs=8, env={"id": "CartPole-v1"})

Without ``url`` the bridge starts a gym orchestrator (``target``: any orchestrator class)
and stops it at `close`; with ``url`` it uses the orchestrator there (any that implements
the contract) and resets it at `close`. The other settings are `BridgeSettings`' (a game
seat against opponents, the episode options, the timeouts). The hops: `OrchestratorSession`
(the orchestrator and the episode run), `gymnasium_relay` (the agent whose requests wait
for the caller), `gymnasium_loopback` (that agent served on a thread).

`reset()` returns the first observation the orchestrator sent; `step(action)` answers the
waiting action request and returns what the next request carries: the copy's next
observation, reward, terminated, truncated, and ``info["action_mask"]`` where the env has
masks (games). A seeded reset starts a fresh episode run (copy i seeded ``seed + i``, as
gymnasium's vector envs seed), and so does a reset in mid-episode; a reset after an episode
ended returns the next episode's first observation, which the orchestrator already reset.
The vector env resets copies as their episodes end (`AutoresetMode.SAME_STEP`, the
orchestrator's own way): the observation of a copy whose episode ended is the next
episode's first, and the final one is in ``info["final_obs"]`` (``info["_final_obs"]``
marks those copies), as `gymnasium.vector.SyncVectorEnv` does in that mode. It needs each
request to ask for every copy: the gym orchestrator's base and subprocess env managers
do; a game's copies fall out of step (play a seat with the `OrchestratorEnv`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from mistk_rl.bridges.gymnasium_relay import Ask, BridgeError, Ended, News, Outcome
from mistk_rl.bridges.gymnasium_session import OrchestratorSession
from mistk_rl.bridges.gymnasium_settings import BridgeSettings
from mistk_rl.spaces import coerce_action

ENV_ID = "mistk_rl/Orchestrator-v0"


def conform(space: spaces.Space, value: Any) -> Any:
    """`value` in the dtype of `space` (JSON brings int64 for an int8 board)."""
    if isinstance(space, spaces.Dict):
        return {key: conform(sub, value[key]) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Discrete):
        return np.int64(np.asarray(value).reshape(()))
    return np.asarray(value, dtype=space.dtype)


def checked_actions(
    space: spaces.Space, actions: Sequence[Any], copies: Sequence[int]
) -> np.ndarray:
    """The actions as one array, row i for copy ``copies[i]``; `gym.error.InvalidAction`
    naming the copy when one is not in `space` (before anything is sent)."""
    rows = []
    for copy, action in zip(copies, actions):
        try:
            rows.append(coerce_action(space, action))
        except ValueError as exc:
            raise gym.error.InvalidAction(f"env copy {copy}: {exc}") from exc
    return np.asarray(rows)


def _outcome(news: News, copy: int) -> Outcome:
    outcome = news.outcomes.get(copy)
    if outcome is None:
        raise BridgeError(
            f"the orchestrator's next request carried no outcome for env copy {copy} "
            f"(it carried {sorted(news.outcomes)})"
        )
    return outcome


def _info(mask: Optional[np.ndarray]) -> dict[str, Any]:
    return {} if mask is None else {"action_mask": np.array(mask, dtype=np.int8)}


class OrchestratorEnv(gym.Env):
    """One env copy of an orchestrator (module doc). Keyword arguments: `BridgeSettings`'."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        env: Union[str, dict[str, Any]],
        url: Optional[str] = None,
        render_mode: Optional[str] = None,
        **settings: Any,
    ) -> None:
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r}: the bridge renders nothing")
        options = BridgeSettings.of(env, url=url, **settings)
        if options.num_envs != 1:
            raise ValueError("OrchestratorEnv plays one env copy: use OrchestratorVectorEnv")
        self._session = OrchestratorSession(options)
        self.observation_space = self._session.observation_space
        self.action_space = self._session.action_space
        self._ask: Optional[Ask] = None  # the request the next step answers
        self._done = True  # the episode ended (or none began): reset next

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None or self._ask is None or not self._done:
            self._ask = self._session.start_run(seed)
        self._done = False
        return conform(self.observation_space, self._ask.obs[0]), _info(
            None if self._ask.masks is None else self._ask.masks[0]
        )

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self._ask is None or self._done:
            raise gym.error.ResetNeeded("call reset() first: no episode is going on")
        news = self._session.exchange(checked_actions(self.action_space, [action], [0]))
        outcome = _outcome(news, 0)
        self._ask = news if isinstance(news, Ask) else None
        terminated = outcome.terminated
        # (a run that ends in mid-episode cuts it: the orchestrator was stopped)
        truncated = outcome.truncated or (isinstance(news, Ended) and not terminated)
        self._done = terminated or truncated
        obs = conform(self.observation_space, outcome.obs)
        return obs, outcome.reward, bool(terminated), bool(truncated), _info(outcome.action_mask)

    def close(self) -> None:
        self._session.close()
        super().close()


class OrchestratorVectorEnv(gym.vector.VectorEnv):
    """`num_envs` env copies of an orchestrator, autoreset in the same step (module doc).
    Keyword arguments: `BridgeSettings`'."""

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        env: Union[str, dict[str, Any]],
        num_envs: int = 1,
        url: Optional[str] = None,
        **settings: Any,
    ) -> None:
        self._session = OrchestratorSession(
            BridgeSettings.of(env, url=url, num_envs=num_envs, **settings)
        )
        self.num_envs = num_envs
        self.single_observation_space = self._session.observation_space
        self.single_action_space = self._session.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._ask: Optional[Ask] = None

    def reset(
        self,
        *,
        seed: Union[int, list[Optional[int]], None] = None,
        options: Optional[dict[str, Any]] = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Every copy starts a new episode (a new episode run); copy i seeded ``seed + i``."""
        self._ask = self._session.start_run(self._base_seed(seed))
        obs, masks = self._rows(self._ask)
        info: dict[str, Any] = {}
        for i, mask in enumerate(masks):
            if mask is not None:
                info = self._add_info(info, _info(mask), i)
        return obs, info

    def _base_seed(self, seed: Union[int, list[Optional[int]], None]) -> Optional[int]:
        """The orchestrator seeds copy i with ``seed + i``: a list must be of that form."""
        if seed is None or isinstance(seed, (int, np.integer)):
            return None if seed is None else int(seed)
        seeds = list(seed)
        if len(seeds) == self.num_envs and all(s is None for s in seeds):
            return None
        first = seeds[0] if seeds else None
        if (
            first is None
            or len(seeds) != self.num_envs
            or any(s != first + i for i, s in enumerate(seeds))
        ):
            raise ValueError(
                f"seed {seeds}: the orchestrator seeds copy i with seed + i, so give one int "
                f"or a list [s, s + 1, ..., s + {self.num_envs - 1}]"
            )
        return int(first)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._ask is None:
            raise gym.error.ResetNeeded("call reset() first")
        per_copy = list(iterate(self.action_space, actions))
        if len(per_copy) != self.num_envs:
            raise gym.error.InvalidAction(f"{len(per_copy)} actions for {self.num_envs} env copies")
        copies = self._ask.copies
        news = self._session.exchange(
            checked_actions(self.single_action_space, [per_copy[c] for c in copies], copies)
        )
        outcomes = [_outcome(news, i) for i in range(self.num_envs)]
        # (a run that ended, stopped from elsewhere: a new one goes on, and every copy's
        # episode was cut)
        self._ask = news if isinstance(news, Ask) else self._session.start_run(None)
        cut = isinstance(news, Ended)
        obs, masks = self._rows(self._ask)
        rewards = np.array([o.reward for o in outcomes], dtype=np.float64)
        terminated = np.array([o.terminated for o in outcomes], dtype=bool)
        truncated = np.array([o.truncated or (cut and not o.terminated) for o in outcomes])
        return (
            obs,
            rewards,
            terminated,
            truncated,
            self._infos(outcomes, terminated | truncated, masks),
        )

    def _infos(
        self, outcomes: list[Outcome], ended: np.ndarray, masks: list[Optional[np.ndarray]]
    ) -> dict[str, Any]:
        """final_obs and final_info of the copies whose episode ended (as SyncVectorEnv
        gives them in SAME_STEP mode), and the action masks of the observations returned."""
        info: dict[str, Any] = {}
        for i, outcome in enumerate(outcomes):
            if ended[i]:
                final = conform(self.single_observation_space, outcome.obs)
                info = self._add_info(
                    info, {"final_obs": final, "final_info": _info(outcome.action_mask)}, i
                )
            if masks[i] is not None:
                info = self._add_info(info, _info(masks[i]), i)
        return info

    def _rows(self, ask: Ask) -> tuple[Any, list[Optional[np.ndarray]]]:
        """The batched observations of every copy, and each copy's mask."""
        rows = {copy: i for i, copy in enumerate(ask.copies)}
        if sorted(rows) != list(range(self.num_envs)):
            raise BridgeError(
                f"the orchestrator asked for actions of env copies {sorted(rows)} of "
                f"{self.num_envs}: a VectorEnv steps every copy each time (a game's copies "
                "fall out of step: play a seat with OrchestratorEnv; an async env manager "
                "answers some copies at a time: use base or subprocess)"
            )
        space = self.single_observation_space
        items = [conform(space, ask.obs[rows[i]]) for i in range(self.num_envs)]
        out: Any = create_empty_array(space, self.num_envs)
        obs = concatenate(space, items, out)
        masks = [None if ask.masks is None else ask.masks[rows[i]] for i in range(self.num_envs)]
        return obs, masks

    def close_extras(self, **kwargs: Any) -> None:
        self._session.close()


def register() -> None:
    """``gymnasium.make(ENV_ID, ...)`` and ``gymnasium.make_vec(ENV_ID, num_envs, ...)``."""
    if ENV_ID not in gym.registry:
        gym.register(
            ENV_ID,
            entry_point=f"{__name__}:OrchestratorEnv",
            vector_entry_point=f"{__name__}:OrchestratorVectorEnv",
        )


register()
