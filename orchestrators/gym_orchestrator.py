"""GymOrchestrator: plays any single-agent gymnasium env against one registered agent.

Each episode: reset (seeded ``seed + i`` when a seed is given), episodeStarted, then
getAction / env.step / replayAction until the env terminates or truncates (or maxSteps),
episodeStopped, and the return and length are recorded. replayAction is skipped in eval
episodes (``train: false``) and for agents registered with skipTrain.
"""
from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import numpy as np

from mistk_rl.errors import InvalidRequest
from mistk_rl.orchestrator import AbstractOrchestrator, RegisteredAgent
from mistk_rl.schemas import EpisodeConfig
from mistk_rl.spaces import SUPPORTED, coerce_action, space_to_dict


class GymOrchestrator(AbstractOrchestrator):
    def __init__(self) -> None:
        super().__init__()
        self.env: Optional[gym.Env] = None

    def validate_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        if agents_needed != 1:
            raise InvalidRequest("GymOrchestrator plays single-agent envs: agentsNeeded "
                                 f"must be 1, not {agents_needed}")
        try:
            gym.spec(env["id"])
        except gym.error.Error as exc:
            raise InvalidRequest(f"unknown gymnasium env {env['id']!r}: {exc}") from exc

    def do_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        self._close_env()
        self.env = gym.make(env["id"], **env.get("kwargs", {}))
        for name, space in (("observation", self.env.observation_space),
                            ("action", self.env.action_space)):
            if not isinstance(space, SUPPORTED):
                raise ValueError(f"{env['id']} has a {name} space {space} that is not supported")

    def agent_config(self, name: str) -> dict[str, Any]:
        return {"observationSpace": space_to_dict(self.env.observation_space),
                "actionSpace": space_to_dict(self.env.action_space)}

    def do_start_episode(self, config: EpisodeConfig) -> None:
        (agent,) = self.agents.values()
        limit, start_steps = config.episode_limit(), self.env_steps
        i = 0
        while limit is None or i < limit:
            if self.should_stop or (config.num_steps is not None
                                    and self.env_steps - start_steps >= config.num_steps):
                return
            seed = None if config.seed is None else config.seed + i
            self._play(agent, config, seed)
            i += 1

    def _play(self, agent: RegisteredAgent, config: EpisodeConfig, seed: Optional[int]) -> None:
        env, name = self.env, agent.name
        learn = config.train and not agent.skip_train
        obs, info = env.reset(seed=seed)
        agent.client.episode_started({name: obs}, mode="collect" if learn else "eval",
                                     action_mask=_mask(name, info), episode=len(self.results))
        episode_return, length = 0.0, 0
        terminated = truncated = cancelled = False
        combined = "step" in agent.capabilities  # replay rides along with the next getAction
        replay = None
        try:
            while not (terminated or truncated):
                if self.should_stop:
                    cancelled = True
                    break
                mask = _mask(name, info)
                if combined:
                    action = agent.client.step({name: obs}, replay=replay, action_mask=mask)[name]
                else:
                    action = agent.client.get_action({name: obs}, mask)[name]
                new_obs, reward, terminated, truncated, info = env.step(
                    coerce_action(env.action_space, action))
                length += 1
                self.env_steps += 1
                episode_return += float(reward)
                truncated = truncated or (config.max_steps is not None
                                          and length >= config.max_steps)
                replay = None if not learn else {
                    "prevObs": {name: obs}, "actions": {name: action},
                    "rewards": {name: float(reward)}, "newObs": {name: new_obs},
                    "terminated": {name: bool(terminated)},
                    "truncated": {name: bool(truncated)}}
                if replay is not None and not combined:
                    agent.client.replay_action(replay)
                    replay = None
                obs = new_obs
            if replay is not None:  # the last transition, which no next step carried
                agent.client.replay_action(replay)
        finally:
            agent.client.episode_stopped()
        self.record_episode(name, episode_return, length, seed=seed, terminated=bool(terminated),
                            truncated=bool(truncated), cancelled=cancelled, train=learn)

    def do_reset(self) -> None:
        self._close_env()

    def do_terminate(self) -> None:
        self._close_env()

    def _close_env(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


def _mask(name: str, info: dict[str, Any]) -> Optional[dict[str, np.ndarray]]:
    """gymnasium envs with masks (e.g. Taxi) put them in info["action_mask"]."""
    mask = info.get("action_mask")
    return None if mask is None else {name: np.asarray(mask)}
