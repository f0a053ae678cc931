"""Dict observations end to end: a gym orchestrator plays an env with a Dict observation
space (`tests.rl.dict_env.DictCue`: the rewarded action shows in uint8 planes) against PPO
and DQN agents over HTTP. Training runs 8 env copies (the binary encoding), evaluation 4
(JSON); both agents must learn the task and keep the planes as uint8 arrays, and bad dict
observations get 400."""

from __future__ import annotations

import numpy as np
import pytest

from mistk_rl.deploy.launch import wait_ready
from mistk_rl.rl.learner import load_checkpoint
from mistk_rl.sdk.client import BadRequest
from tests.conftest import GYM_ORCHESTRATOR

ENV = "tests.rl.dict_env:DictCue-v0"  # 8 steps an episode: a random policy scores 4
SMALL = {"hidden_sizes": [32]}
PPO = (
    "agents.ppo_agent:PPOAgent",
    {
        "seed": 0,
        "train": {"n_steps": 64},
        "policy": {"model": SMALL, "learn": {"epochs": 10, "batch_size": 64, "lr": 3e-3}},
    },
)
DQN = (
    "agents.dqn_agent:DQNAgent",
    {
        "seed": 0,
        "train": {"learning_starts": 64, "train_freq": 8, "gradient_steps": 4},
        "buffer": {"replay_buffer_size": 1000},
        "policy": {
            "model": SMALL,
            "collect": {"eps": {"duration": 300, "end": 0.05}},
            "learn": {"batch_size": 32, "gamma": 0.5, "target": {"every": 32}},
        },
    },
)


def test_ppo_and_dqn_learn_from_dict_observations_over_http(launch):
    orch_service = launch(
        "orchestrator",
        GYM_ORCHESTRATOR,
        wait=False,
        extra_args=["--env-module", "tests.rl.dict_env"],
    )
    agents = {
        name: launch("agent", target, wait=False)
        for name, (target, _) in (("ppo", PPO), ("dqn", DQN))
    }
    for service in (orch_service, *agents.values()):
        wait_ready(service, 60)
    orch = orch_service.client()
    for name, (_, hparams) in (("ppo", PPO), ("dqn", DQN)):
        agent = agents[name].client()
        agent.initialize(hyperparameters=hparams)
        agent.build_model()
        orch.reset()
        orch.initialize(ENV)
        orch.register_agent(name, agents[name].url)
        orch.start_episode({"numSteps": 640, "numEnvs": 8, "seed": 0}, wait=True, timeout=120)
        orch.stop_episode()
        assert agent.status().payload["envSteps"] >= 640
        before = len(orch.get_results().episodes)
        orch.start_episode(
            {"numEpisodes": 4, "numEnvs": 4, "seed": 100, "train": False}, wait=True, timeout=60
        )
        orch.stop_episode()
        returns = [e.return_ for e in orch.get_results().episodes[before:]]
        assert np.mean(returns) >= 6, (name, returns)  # a random policy: 4

        agent.save_model("model.pt")
        trainer = load_checkpoint(agents[name].data_dir / "model.pt")["trainer"]
        if name == "dqn":  # the replay buffer: one array per key, planes kept as uint8
            columns = trainer["buffer"]["ring"]["columns"]
            assert columns[("obs", "planes")].dtype == np.uint8
            assert columns[("next_obs", "planes")].shape == (1000, 2, 3, 3)
            assert columns[("obs", "noise")].dtype == np.float32
        else:  # the PPO rollout in progress
            steps = [step for entity in trainer["rollout"].values() for step in entity]
            assert steps and all(s["obs"]["planes"].dtype == np.uint8 for s in steps)
            _refuses_bad_dict_observations(agent)


def _refuses_bad_dict_observations(agent) -> None:
    """A dict observation with a key missing or extra, or a key's array of the wrong shape
    or out of its space, gets 400 naming the entity and key (JSON and binary alike), and
    changes nothing."""
    good = {"noise": [0.0, 0.5, -0.5], "planes": np.eye(3, dtype=np.uint8)[None].repeat(2, 0)}
    agent.episode_started({"p": good})
    before = agent.status()
    for bad, match in (
        ({"noise": good["noise"]}, r"obs\['p'\]: missing key\(s\) \['planes'\]"),
        ({**good, "extra": [1.0]}, r"unexpected key\(s\) \['extra'\]"),
        (
            {**good, "planes": np.ones((3, 3))},
            r"obs\['p'\]\['planes'\]: shape \(3, 3\) is not \(2, 3, 3\)",
        ),
        ({**good, "planes": good["planes"] * 2}, r"\['planes'\]: a value is outside the space"),
        (
            {**good, "noise": [0.0, np.nan, 0.0]},  # JSON: NaN; binary: a NaN
            r"obs\['p'\]\['noise'\](\[1\]: NaN is not a JSON number|: not every)",
        ),
        (good["noise"], r"one Tensor, where an object .* is expected"),
    ):
        for binary in (False, True):
            agent.binary = binary
            with pytest.raises(BadRequest, match=match):
                agent.step({"p": bad})
    after = agent.status()
    assert (after.state, after.resource_version) == (before.state, before.resource_version)
    agent.binary = False
    assert set(agent.get_action({"p": good})) == {"p"}
