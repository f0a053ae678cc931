"""Local inference (issue 23, item 4): a copy of the agent's policy acts next to the env, the
experience goes to the agent in batches (replayColumns), new weights come back."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from agents.random_agent import RandomAgent
from harness.bench.step import InProcessClient
from mistk_rl.errors import IllegalState, InvalidRequest
from mistk_rl.framework.agent import rounds
from mistk_rl.sdk.client import ServiceError
from mistk_rl.sdk.stepping import LocalInference, LocalStepper
from mistk_rl.service.handlers import AgentService
from mistk_rl.spaces import space_to_dict
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT
from tests.test_step_columns import SPACES, _service, _train

DQN = {
    "log_every": 0,
    "train": {"learning_starts": 40, "train_freq": 10, "gradient_steps": 5},
    "policy": {"model": {"hidden_sizes": [32]}, "learn": {"batch_size": 16}},
}
PPO = {
    "log_every": 0,
    "train": {"n_steps": 64},
    "policy": {"learn": {"epochs": 2, "batch_size": 32}},
}


def _ready(service: AgentService) -> InProcessClient:
    """The service registered and between episodes (where a copy is taken)."""
    return InProcessClient(service)


def _rows(n: int, env: int = 0, start: float = 0.0) -> dict:
    """replayColumns' body: `n` CartPole steps of env copy `env`, obs start, start+1, ..."""
    obs = (start + np.arange(n, dtype=np.float32))[:, None].repeat(4, 1) / 100
    return {
        "envs": np.full(n, env),
        "obs": obs,
        "actions": np.arange(n) % 2,
        "rewards": np.ones(n),
        "nextObs": obs + 0.01,
        "terminated": np.zeros(n, bool),
    }


def test_rounds_keep_each_keys_rows_in_order():
    assert rounds([0, 1, 0, 0, 1, 2]) == [[0, 1, 5], [2, 4], [3]]


@pytest.mark.parametrize("agent_cls, hparams", [(DQNAgent, DQN), (PPOAgent, PPO)])
def test_a_copy_trains_the_agent_and_takes_its_weights(tmp_path, agent_cls, hparams):
    """The experience of 2 env copies reaches the agent in batches of 16 steps; the agent
    learns from all of it and each answer brings its newest weights (sync_every 1)."""
    service = _service(tmp_path, agent_cls(), hparams)
    stepper = LocalStepper(_ready(service), LocalInference(sync_every=1, batch_steps=16))
    _train(service, stepper, 150)
    agent = service.agent
    assert agent.learner.env_steps == stepper.env_steps == 300
    assert stepper.sends == 19  # 300 steps in batches of 16, the last one partial
    assert agent.learner.train_iter > 0 and stepper.version == agent.learner.train_iter
    for mine, theirs in zip(stepper.policy.model.parameters(), agent.policy.model.parameters()):
        assert torch.equal(mine, theirs)


def test_a_copy_explores_and_masks_as_the_agent_does(tmp_path):
    """Same weights, same epsilon at the same env step: greedy actions agree, a mask is
    obeyed, epsilon 1 explores uniformly."""
    service = _service(tmp_path, DQNAgent(), {**DQN, "train": {"learning_starts": 0}})
    client = _ready(service)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    greedy = LocalStepper(client, mode="eval")
    ours = greedy.step(dict(enumerate(obs)), {})
    theirs = service.agent.policy.eval_mode.forward(torch.as_tensor(obs), None)["action"]
    assert [int(ours[i]) for i in range(64)] == theirs.tolist()
    masked = LocalStepper(client, epsilon=1.0)
    mask = np.array([False, True])
    actions = masked.step(dict(enumerate(obs)), {}, {i: mask for i in range(64)})
    assert set(int(a) for a in actions.values()) == {1}
    explored = LocalStepper(client, epsilon=1.0).step(dict(enumerate(obs)), {})
    assert 16 < sum(int(a) for a in explored.values()) < 48
    epsilon = service.agent.policy.exploration(service.agent.learner.env_steps)
    assert masked.policy.exploration(masked.env_steps) == epsilon


def test_rows_of_one_env_copy_reach_the_learner_in_order(tmp_path):
    """A batch holds several steps per copy: the rollout gets them in time order."""
    service = _service(tmp_path, PPOAgent(), PPO)
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    copy = InProcessClient(service).get_policy(weights=False)
    assert set(copy.extras) == {"action", "log_prob", "value", "action_mask"}
    body = {
        **_rows(3),
        "envs": np.array([0, 1, 0]),
        "extras": {
            "action": np.array([0, 1, 0]),
            "log_prob": np.full(3, -0.7),
            "value": np.zeros(3),
        },
    }
    service.replayColumns(body)
    rollout = service.agent.trainer.rollout()
    assert [round(float(t["obs"][0]) * 100) for t in rollout[0].rows()] == [0, 2]
    assert [round(float(t["obs"][0]) * 100) for t in rollout[1].rows()] == [1]
    assert service.agent.learner.env_steps == 3


@pytest.mark.parametrize(
    "change, match",
    [
        ({"extras": {"q": np.zeros(3)}}, "unknown: \\['q'\\]"),
        ({"extras": {"log_prob": np.zeros(3), "value": np.zeros(3)}}, "missing: \\['action'\\]"),
        (
            {"extras": {"action": np.zeros(3), "log_prob": np.zeros((3, 2)), "value": np.zeros(3)}},
            "rows of shape \\(\\)",
        ),
        ({"actions": np.array([0, 5, 1])}, "actions"),
        ({"rewards": np.array([1.0, np.nan, 1.0])}, "rewards"),
        ({"nextObs": np.zeros((2, 4))}, "nextObs: 2 rows"),
    ],
)
def test_bad_experience_is_refused_and_changes_nothing(tmp_path, change, match):
    service = _service(tmp_path, PPOAgent(), PPO)
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    good = {
        "extras": {"action": np.array([0, 1, 0]), "log_prob": np.zeros(3), "value": np.zeros(3)}
    }
    with pytest.raises(InvalidRequest, match=match):
        service.replayColumns({**_rows(3), **good, **change})
    assert service.agent.learner.env_steps == 0 and not service.agent.trainer.rollout()
    assert service.lifecycle.state == "in_episode"


def test_copies_are_refused_where_there_is_none(tmp_path):
    random_agent = _service(tmp_path / "r", RandomAgent())
    assert "local" not in random_agent.capabilities
    with pytest.raises(InvalidRequest, match="offers no local inference"):
        random_agent.getPolicy()
    unregistered = AgentService(DQNAgent(), tmp_path / "u")
    with pytest.raises(IllegalState, match="register the agent first"):
        unregistered.getPolicy()
    normalized = _service(tmp_path / "n", DQNAgent(), {**DQN, "normalize": {"obs": True}})
    with pytest.raises(InvalidRequest, match="normalize.obs"):
        normalized.getPolicy()
    assert normalized.lifecycle.state == "ready"


def test_weights_come_back_only_when_sync_every_updates_are_due(tmp_path):
    service = _service(
        tmp_path,
        DQNAgent(),
        {
            **DQN,
            "train": {"learning_starts": 4, "train_freq": 4, "gradient_steps": 1},
            "policy": {"learn": {"batch_size": 4}, "model": {"hidden_sizes": [8]}},
        },
    )
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    answer, _, _ = service.replayColumns({**_rows(8), "weightsVersion": 0, "syncEvery": 2})
    assert answer["version"] == 1 and "weights" not in answer  # 1 update: not yet 2
    answer, _, _ = service.replayColumns({**_rows(4, start=8), "weightsVersion": 0, "syncEvery": 2})
    assert answer["version"] == 2 and answer["envSteps"] == 12
    assert answer["weights"]["names"] == list(service.agent.policy.model.state_dict())


@pytest.mark.parametrize("binary", [False, True])
def test_policy_copies_and_experience_over_http(launch, binary):
    service = launch("agent", "agents.dqn_agent:DQNAgent")
    agent = service.client()
    assert "local" in agent.api_version().capabilities
    agent.initialize(hyperparameters=DQN)
    agent.build_model()
    agent.agent_registered({"name": "p", **SPACES})
    agent.binary = binary
    copy = agent.get_policy()
    assert copy.policy == "DQNPolicy" and copy.warmup_until == 40 and copy.version == 0
    assert all(w.dtype == np.float32 for w in copy.weights.values())
    assert copy.weights.keys() == {
        "encoder.mlp.net.0.weight",
        "encoder.mlp.net.0.bias",
        "head.out.net.0.weight",
        "head.out.net.0.bias",
    }
    agent.episode_started({"p": [0, 0, 0, 0]})
    rows = _rows(48)
    learned = agent.replay_columns(
        rows["envs"],
        rows["obs"],
        rows["actions"],
        rows["rewards"],
        rows["nextObs"],
        rows["terminated"],
    )
    assert learned.env_steps == 48 and learned.version > 0 and learned.weights
    with pytest.raises(ServiceError, match="extras"):
        agent.replay_columns(
            rows["envs"],
            rows["obs"],
            rows["actions"],
            rows["rewards"],
            rows["nextObs"],
            rows["terminated"],
            extras={"x": np.zeros(48)},
        )
    assert agent.status().payload["envSteps"] == 48


def test_the_gym_orchestrator_runs_a_copy_when_asked(launch):
    """localInference in startEpisode: the agent learns from every env step without a
    single step request; an agent without copies is refused with a 400 naming why."""
    orch_service = launch("orchestrator", GYM_ORCHESTRATOR)
    agent_service = launch("agent", "agents.dqn_agent:DQNAgent")
    orch, agent = orch_service.client(), agent_service.client()
    orch.initialize("CartPole-v1")
    agent.initialize(hyperparameters=DQN)
    agent.build_model()
    orch.register_agent("player", agent_service.url, local_inference=True)
    local = {"player": {"localInference": {"batchSteps": 32}}}
    orch.start_episode(
        {"numSteps": 200, "seed": 0, "numEnvs": 2, "agents": local}, wait=True, timeout=120
    )
    orch.stop_episode()
    payload = agent.status().payload
    assert payload["envSteps"] == orch.status().payload["envSteps"] >= 200
    assert payload["updates"] > 0
    orch.start_episode(
        {"numEpisodes": 2, "seed": 5, "train": False, "agents": local}, wait=True, timeout=120
    )
    orch.stop_episode()
    assert agent.status().payload["envSteps"] == payload["envSteps"]  # eval: no experience
    random_service = launch("agent", RANDOM_AGENT)
    orch.reset(reset_agents=False)
    orch.initialize("CartPole-v1")
    random_service.client().initialize(hyperparameters={"seed": 0})
    random_service.client().build_model()
    before, agent_before = orch.status(), random_service.client().status()
    with pytest.raises(ServiceError, match="capability 'local'") as refused:
        orch.register_agent("player", random_service.url, local_inference=True)
    assert refused.value.status == 400
    after = orch.status()
    assert (after.state, after.resource_version) == (before.state, before.resource_version)
    agent_after = random_service.client().status()  # (never told it was registered)
    assert agent_after.resource_version == agent_before.resource_version
    orch.register_agent("player", random_service.url)
    with pytest.raises(ServiceError, match="capability 'local'"):
        orch.start_episode({"numSteps": 10, "agents": local})


@pytest.mark.parametrize(
    "policy_cls, config",
    [
        ("mistk_rl.rl.policies.dqn:DQNPolicy", {"model": {"hidden_sizes": [32]}}),
        ("mistk_rl.rl.policies.ppo:PPOPolicy", {}),
    ],
)
def test_a_policy_built_to_act_only_acts_as_one_that_learns(policy_cls, config):
    """A copy is built with learns=False: no optimiser (whose first construction imports
    torch._dynamo) and no target network; seeded alike, it acts as the learning policy."""
    import importlib

    module, _, name = policy_cls.partition(":")
    cls = getattr(importlib.import_module(module), name)
    env = gym.make("CartPole-v1")
    learning = cls(config, env.observation_space, env.action_space, seed=3)
    acting = cls(config, env.observation_space, env.action_space, seed=3, learns=False)
    assert hasattr(learning, "optimizer") and not hasattr(acting, "optimizer")
    assert not hasattr(acting, "target")
    with pytest.raises(RuntimeError, match="learns=False"):
        acting.learn_mode  # noqa: B018 - the attribute read is what raises
    obs = torch.as_tensor(np.random.default_rng(0).normal(size=(32, 4)), dtype=torch.float32)
    for step in (0, 5000, 20000):  # exploring, then mostly greedy
        with torch.no_grad():
            ours = acting.collect_mode.forward(obs, None, step)["action"]
            theirs = learning.collect_mode.forward(obs, None, step)["action"]
        assert torch.equal(ours, theirs)


def test_spaces_of_the_copy_are_the_agents(tmp_path):
    service = _service(tmp_path, PPOAgent(), PPO)
    copy = InProcessClient(service).get_policy(weights=False)
    env = gym.make("CartPole-v1")
    assert copy.observation_space.model_dump(by_alias=True, exclude_none=True) == space_to_dict(
        env.observation_space
    )
    assert copy.weights is None


def test_a_copy_sends_each_env_copys_steps_in_time_order(tmp_path):
    """Async env managers report outcomes in any order: a batch's rows go together, batches
    in the order they acted, so each copy's steps reach the agent in time order."""
    from mistk_rl.sdk.stepping import StepOutcome

    service = _service(tmp_path, DQNAgent(), DQN)
    sent = []

    class Recording(InProcessClient):
        def replay_columns(self, envs, obs, *args, **kwargs):
            sent.append((envs.tolist(), np.asarray(obs)[:, 0].astype(float).round(3).tolist()))
            return super().replay_columns(envs, obs, *args, **kwargs)

    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    stepper = LocalStepper(Recording(service), LocalInference(batch_steps=100))
    o = lambda v: np.full(4, v, np.float32)  # noqa: E731
    stepper.step({0: o(0.1), 1: o(0.2)}, {})  # batch A: both copies act
    stepper.step({1: o(0.3)}, {1: StepOutcome(o(0.3), 1.0, False, False)})  # B: copy 1 only
    stepper.step(
        {},
        {
            1: StepOutcome(o(0.4), 1.0, False, False),  # B's outcome before A's
            0: StepOutcome(o(0.5), 1.0, True, False),
        },
    )
    assert sent == [([1, 0, 1], [0.2, 0.1, 0.3])]  # A's rows, then B's
    assert service.agent.learner.env_steps == 3


def test_a_run_config_with_a_copy_registers_it_so_and_trains_through_it(tmp_path, monkeypatch):
    """The harness registers an agent whose entry has local_inference with
    localInference=true: a run trains and evaluates through the copy, and an agent that
    offers no copy stops the run at registration, before any episode, naming why."""
    from harness.config import RunConfig
    from harness.run import run
    from tests.conftest import REPO

    monkeypatch.chdir(REPO)

    def config(target: str, hyperparameters: dict) -> RunConfig:
        return RunConfig.model_validate(
            {
                "name": "local_smoke",
                "orchestrator": {"target": GYM_ORCHESTRATOR, "env": {"id": "CartPole-v1"}},
                "agents": [
                    {
                        "name": "player",
                        "target": target,
                        "hyperparameters": hyperparameters,
                        "local_inference": {"batch_steps": 32},
                    }
                ],
                "training": {
                    "env_steps": 400,
                    "eval_every": 200,
                    "eval_episodes": 2,
                    "num_envs": 2,
                },
            }
        )

    results = run(config("agents.dqn_agent:DQNAgent", DQN), tmp_path / "dqn", say=lambda _: None)
    assert [e["env_steps"] for e in results["evals"]] == [200, 400]
    said: list[str] = []
    with pytest.raises(
        Exception,
        match=r"localInference: agent 'player' .* offers no policy "
        r"copy \(it does not list the capability 'local'\)",
    ):
        run(config(RANDOM_AGENT, {"seed": 0}), tmp_path / "random", say=said.append)
    assert not any("eval at" in line for line in said)
