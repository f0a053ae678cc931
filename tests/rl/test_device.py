"""The agents' `device` (mistk_rl.rl.device): resolution, refusal, and that naming the CPU,
or moving a checkpoint between devices, changes nothing a seeded run does.

No test runs anything on CUDA: "a GPU is present" is `torch.cuda.is_available` patched,
and the moves to a device are checked on torch's meta device (shapes only, no data).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from mistk_rl.errors import InvalidRequest
from mistk_rl.rl.actor import Actor
from mistk_rl.rl.config import AgentConfigError
from mistk_rl.rl.data.collate import to_device
from mistk_rl.rl.data.samples import RolloutSamples
from mistk_rl.rl.device import resolve_device
from mistk_rl.rl.learner import Learner, LearnMode, UpdatePlan, load_checkpoint, save_checkpoint
from mistk_rl.service.handlers import AgentService
from tests.rl.test_checkpoints import DQN_HP, PPO_HP, Envs, _agent, _counters, _same_weights

META = torch.device("meta")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


# ---- resolution ------------------------------------------------------------------------------


def test_auto_is_the_cpu_without_a_gpu_and_cpu_is_always_the_cpu(no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_and_cuda_are_cuda_where_torch_sees_a_gpu(a_gpu):
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_a_gpu_is_refused_naming_device(no_gpu):
    with pytest.raises(AgentConfigError, match=r"^device: 'cuda' .*no CUDA GPU"):
        resolve_device("cuda")


@pytest.mark.parametrize("name", ["gpu", "CUDA", None, 0])
def test_other_names_are_refused_naming_the_valid_ones(name):
    with pytest.raises(AgentConfigError, match=r"^device must be one of auto, cpu, cuda"):
        resolve_device(name)


@pytest.mark.parametrize("cls", [DQNAgent, PPOAgent])
def test_initialize_refuses_cuda_without_a_gpu_as_a_bad_hyperparameter(tmp_path, no_gpu, cls):
    service = AgentService(cls(), tmp_path / "agent")
    with pytest.raises(InvalidRequest, match=r"hyperparameters: device: 'cuda'"):
        service.initialize({"hyperparameters": {"seed": 0, "device": "cuda"}})
    assert service.lifecycle.status()["state"] == "started"  # nothing changed
    service.initialize({"hyperparameters": {"seed": 0, "device": "cpu"}})  # the same, fitting
    service.lifecycle.wait_for_state("initialized", 10)
    assert service.agent.config["device"] == "cpu"


# ---- where tensors cross ---------------------------------------------------------------------


def _rollout(n: int = 6) -> RolloutSamples:
    return RolloutSamples(
        obs={"a": torch.zeros(n, 3), "b": torch.ones(n, 2, dtype=torch.uint8)},
        action=torch.zeros(n, dtype=torch.int64),
        log_prob=torch.zeros(n),
        value=torch.zeros(n),
        advantage=torch.ones(n),
        returns=torch.ones(n),
        env_steps=42,
    )


def test_to_device_moves_every_tensor_of_a_typed_batch_and_keeps_the_rest():
    moved = to_device(_rollout(), META)
    assert type(moved) is RolloutSamples and moved.env_steps == 42 and moved.action_mask is None
    assert {key: t.device for key, t in moved.obs.items()} == {"a": META, "b": META}
    assert moved.obs["b"].dtype == torch.uint8
    assert all(
        getattr(moved, f).device == META
        for f in ("action", "log_prob", "value", "advantage", "returns")
    )


def test_to_device_on_the_cpu_returns_the_same_tensors():
    batch = _rollout()
    moved = to_device(batch, torch.device("cpu"))
    assert moved.obs["a"] is batch.obs["a"] and moved.returns is batch.returns


def test_the_learner_hands_the_policy_its_batches_on_the_policy_device():
    seen = []

    def forward(batch):
        seen.append(batch)
        return {}

    def plan(batch):
        seen.append(batch)
        return UpdatePlan(batch, [torch.arange(6)], {})

    learner = Learner(LearnMode(forward, dict, lambda state: None, plan, None, META))
    learner.train(_rollout())
    learner.plan(_rollout())
    # a checkpoint's plan (loaded on the CPU) goes back to the device too
    state = UpdatePlan(_rollout(), [torch.arange(6)], {"lr": 0.1}, done=0).state_dict()
    restored = learner.restore_plan(state, RolloutSamples)
    for batch in [*seen, restored.batch]:
        assert batch.returns.device == META and batch.obs["a"].device == META
    assert restored.rows[0].device == torch.device("cpu")  # drawn on the CPU, stays there


def test_the_actor_gives_each_policy_rows_on_its_device_and_returns_arrays():
    """The agent's policy on a device; the warm-up's random policy on the CPU."""
    seen = {}

    def policy(name, device):
        def forward(obs, mask, *step):
            seen[name] = (obs.device, mask.device)
            return {
                "action": torch.zeros(len(obs), dtype=torch.int64),
                "log_prob": torch.zeros(len(obs)),
            }

        mode = SimpleNamespace(forward=forward)
        return SimpleNamespace(
            device=device,
            collect_mode=mode,
            eval_mode=mode,
            transition_extras=lambda: {"log_prob": ()},
        )

    actor = Actor(policy("model", META), warmup=policy("warmup", torch.device("cpu")))
    obs, mask = np.zeros((3, 4), np.float32), np.ones((3, 2), bool)
    actions, extras = actor.act(obs, mask, mode="collect", env_steps=0, warming_up=False)
    assert seen["model"] == (META, META)
    assert type(actions) is np.ndarray and type(extras["log_prob"]) is np.ndarray
    actor.act(obs, mask, mode="collect", env_steps=0, warming_up=True)
    assert seen["warmup"] == (torch.device("cpu"),) * 2


# ---- agents ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, hparams", [(DQNAgent, DQN_HP), (PPOAgent, PPO_HP)])
def test_an_agent_told_cpu_trains_exactly_as_the_default(tmp_path, no_gpu, cls, hparams):
    """300 env steps (150 on each of two CartPole copies) of DQN (past learning_starts:
    updates) and of PPO (four rollouts): the same actions, updates and weights."""
    default = _agent(cls, hparams, tmp_path / "default")
    cpu = _agent(cls, {**hparams, "device": "cpu"}, tmp_path / "cpu")
    assert cpu.policy.device == default.policy.device == torch.device("cpu")
    assert Envs(0).play(default, 150) == Envs(0).play(cpu, 150)
    assert default.progress()["updates"] > 0
    assert default.progress() == cpu.progress()
    assert _same_weights(default, cpu)


@pytest.mark.parametrize("cls, hparams", [(DQNAgent, DQN_HP), (PPOAgent, PPO_HP)])
@pytest.mark.parametrize("saved_on, loaded_on", [("cpu", "auto"), ("auto", "cpu"), ("cuda", None)])
def test_a_checkpoint_loads_on_another_device_and_continues_as_the_original(
    tmp_path, no_gpu, cls, hparams, saved_on, loaded_on
):
    """The loading service's device wins over the saver's, even when its initialize names
    none (None: the default, auto): a checkpoint from a GPU node (its config says cuda; here
    the config is rewritten so) loads where there is none."""
    original = _agent(
        cls, {**hparams, "device": "cpu" if saved_on == "cuda" else saved_on}, tmp_path / "a"
    )
    Envs(0).play(original, 64)
    path = tmp_path / "a" / "ckpt.pt"
    original.do_save_model(path)
    if saved_on == "cuda":
        checkpoint = load_checkpoint(path)
        checkpoint["config"]["device"] = "cuda"
        save_checkpoint(checkpoint, path)
    given = {} if loaded_on is None else {"device": loaded_on}
    restored = _agent(cls, {**hparams, "seed": 7, **given}, tmp_path / "b", path)
    assert restored.config["device"] == (loaded_on or "auto")
    assert _counters(restored) == _counters(original) and _same_weights(original, restored)
    assert Envs(100).play(original, 40) == Envs(100).play(restored, 40)
    assert original.progress() == restored.progress()
    assert _same_weights(original, restored)


def test_a_local_inference_copy_gets_cpu_float32_arrays(tmp_path):
    agent = _agent(PPOAgent, {**PPO_HP, "device": "cpu"}, tmp_path)
    weights = agent.do_policy_copy(weights=True).weights
    assert weights and all(
        type(w) is np.ndarray and w.dtype == np.float32 for w in weights.values()
    )
