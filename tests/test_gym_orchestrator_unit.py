"""GymOrchestrator's step loop in-process, with a recording stand-in for the agent client."""

from __future__ import annotations

from mistk_rl.framework.orchestrator import RegisteredAgent
from mistk_rl.sdk.schemas import EpisodeConfig
from orchestrators.gym_orchestrator import GymOrchestrator


class RecordingClient:
    """Answers like an agent that always pushes the cart left; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def episode_started(self, obs, **kw):
        self.calls.append(("episode_started", False))

    def get_action(self, obs, action_mask=None):
        self.calls.append(("get_action", False))
        return {name: 0 for name in obs}

    def step(self, obs, replay=None, action_mask=None):
        self.calls.append(("step", replay is not None))
        return {name: 0 for name in obs}

    def replay_action(self, replay):
        self.calls.append(("replay_action", True))

    def episode_stopped(self):
        self.calls.append(("episode_stopped", False))


def _play(capabilities: frozenset, train: bool = True):
    orch = GymOrchestrator()
    orch.do_initialize({"id": "CartPole-v1", "kwargs": {}}, 1)
    client = RecordingClient()
    orch.agents["p"] = RegisteredAgent("p", "http://127.0.0.1:1", False, client, capabilities)
    orch.do_start_episode(EpisodeConfig(num_episodes=1, seed=0, train=train))
    return client.calls, orch.results[0]["length"]


def test_without_step_capability_every_step_is_get_action_then_replay():
    calls, length = _play(frozenset())
    names = [name for name, _ in calls]
    assert names.count("get_action") == names.count("replay_action") == length
    assert names[1:3] == ["get_action", "replay_action"] and names[-1] == "episode_stopped"


def test_with_step_capability_replays_ride_along():
    calls, length = _play(frozenset({"step"}))
    steps = [carries for name, carries in calls if name == "step"]
    assert len(steps) == length
    assert steps[0] is False and all(steps[1:])  # every step but the first carries a replay
    # the last transition has no next step to ride on: it goes alone, once
    assert [name for name, _ in calls][-2:] == ["replay_action", "episode_stopped"]
    assert sum(name == "replay_action" for name, _ in calls) == 1


def test_eval_episodes_send_no_replay():
    calls, _ = _play(frozenset({"step"}), train=False)
    assert not any(carries for _, carries in calls)


def test_a_pipeline_needs_an_agent_that_takes_step_columns():
    """pipelineDepth pipelines stepColumns: an agent that only takes the entity form (one
    written against MISTK's API) is refused with a 400 naming why."""
    import pytest

    from mistk_rl.errors import InvalidRequest
    from mistk_rl.sdk.schemas import GymEpisodeSettings

    orch = GymOrchestrator()
    orch.do_initialize({"id": "CartPole-v1", "kwargs": {}}, 1)
    orch.agents["p"] = RegisteredAgent(
        "p", "http://127.0.0.1:1", False, RecordingClient(), frozenset({"step", "tensors"})
    )
    with pytest.raises(InvalidRequest, match="does not take stepColumns"):
        orch.validate_start_episode(GymEpisodeSettings(num_envs=4, pipeline_depth=2))
    orch.validate_start_episode(GymEpisodeSettings(num_envs=4))  # depth 1: any agent


def test_the_encoding_follows_the_size_of_a_requests_observations():
    """stepColumns goes binary once one request's observations reach BINARY_FROM_BYTES
    (numEnvs / pipelineDepth copies); the entity form from BINARY_FROM_ENVS copies; local
    inference always; an agent without the binary encoding never."""
    import gymnasium as gym
    import numpy as np

    from orchestrators.gym_orchestrator import BINARY_FROM_BYTES, binary_for

    columns, entity = frozenset({"columns", "tensors"}), frozenset({"step", "tensors"})
    vector = gym.spaces.Box(-1, 1, (4,), np.float32)  # 16 bytes
    image = gym.spaces.Dict(
        {
            "planes": gym.spaces.Box(0, 255, (4, 32, 32), np.uint8),
            "score": gym.spaces.Box(0, 1, (1,), np.float32),
        }
    )
    rows = BINARY_FROM_BYTES // 16
    assert not binary_for(columns, vector, rows - 1)
    assert binary_for(columns, vector, rows)
    assert not binary_for(columns, vector, rows, depth=2)  # half a request's rows each
    assert binary_for(columns, image, 1)
    assert binary_for(columns, vector, 1, local=True)
    assert not binary_for(entity, vector, 7) and binary_for(entity, vector, 8)
    assert not binary_for(frozenset({"columns"}), image, 64)


def test_finished_episodes_do_not_wake_long_polls_one_by_one():
    """Random CartPole episodes end every few ms; each wake of the status long-polls costs
    every waiting caller a round trip and the step loop the GIL, so finished episodes wake
    them as progress does (at most once a second), while status still shows the latest."""
    from mistk_rl.lifecycle import ORCHESTRATOR, Lifecycle

    orch = GymOrchestrator()
    orch._lifecycle = Lifecycle(ORCHESTRATOR)
    orch.do_initialize({"id": "CartPole-v1", "kwargs": {}}, 1)
    orch.agents["p"] = RegisteredAgent(
        "p", "http://127.0.0.1:1", False, RecordingClient(), frozenset({"step"})
    )
    before = orch._lifecycle.version
    orch.do_start_episode(EpisodeConfig(num_episodes=30, seed=0, train=True))
    assert len(orch.results) == 30
    assert orch._lifecycle.version - before < 10  # one per episode was 30 and more
    assert orch._lifecycle.payload["episodesDone"] == 30
