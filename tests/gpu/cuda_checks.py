"""Checks that need a CUDA GPU, run by hand where one is (CI has none, so they are not
collected by the suite: their files are not named test_*):

    python -m pytest -o python_files=cuda_checks.py tests/gpu/

An agent with ``device: auto`` (the default) trains on the GPU; its checkpoint acts the same
on the CPU, and a CPU checkpoint the same on the GPU; over HTTP, the harness's DQN config
reaches CartPole's threshold with its agent service on the GPU.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from tests.rl.test_checkpoints import DQN_HP, PPO_HP, Envs, _agent

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _greedy_outputs(agent, observations: np.ndarray) -> torch.Tensor:
    """The acting network's outputs (Q-values or logits) for a batch, on the CPU."""
    model = agent.policy.model
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.eval()(torch.as_tensor(observations, device=device))
    return out["logit"].float().cpu()


def _observations(n: int = 256) -> np.ndarray:
    space = gym.make("CartPole-v1").observation_space
    space.seed(0)
    return np.stack([space.sample() for _ in range(n)]).astype(np.float32)


@pytest.mark.parametrize("cls, hparams, steps", [(DQNAgent, DQN_HP, 100), (PPOAgent, PPO_HP, 64)])
def test_auto_trains_on_the_gpu_and_checkpoints_cross_devices(tmp_path, cls, hparams, steps):
    trained = _agent(cls, {**hparams, "device": "auto"}, tmp_path / "gpu")
    assert next(trained.policy.model.parameters()).device.type == "cuda"
    before = [p.detach().clone() for p in trained.policy.model.parameters()]
    Envs(0).play(trained, steps)
    assert trained.progress()["updates"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trained.policy.model.parameters()))
    trained.do_save_model(tmp_path / "gpu" / "ckpt.pt")

    on_cpu = _agent(
        cls, {**hparams, "device": "cpu"}, tmp_path / "cpu", tmp_path / "gpu" / "ckpt.pt"
    )
    assert next(on_cpu.policy.model.parameters()).device.type == "cpu"
    obs = _observations()
    gpu_out, cpu_out = _greedy_outputs(trained, obs), _greedy_outputs(on_cpu, obs)
    assert torch.allclose(gpu_out, cpu_out, atol=1e-4)
    assert torch.equal(gpu_out.argmax(1), cpu_out.argmax(1))

    # and back: the CPU agent's checkpoint on the GPU, after the CPU agent trained on
    Envs(100).play(on_cpu, steps)
    on_cpu.do_save_model(tmp_path / "cpu" / "ckpt.pt")
    back = _agent(
        cls, {**hparams, "device": "cuda"}, tmp_path / "back", tmp_path / "cpu" / "ckpt.pt"
    )
    assert next(back.policy.model.parameters()).device.type == "cuda"
    assert torch.allclose(_greedy_outputs(back, obs), _greedy_outputs(on_cpu, obs), atol=1e-4)


def test_the_harness_trains_dqn_over_http_with_its_agent_on_the_gpu(tmp_path, monkeypatch):
    from pathlib import Path

    import yaml

    from harness.config import RunConfig
    from harness.run import run

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    data = yaml.safe_load((repo / "configs" / "cartpole_dqn.yaml").read_text())
    data["agents"][0]["hyperparameters"]["device"] = "cuda"  # refused where there is none
    results = run(RunConfig.model_validate(data), tmp_path / "run", say=print)
    evals = results["evals"]
    print("evals:", [(e["env_steps"], e["mean_return"]) for e in evals])
    assert max(e["mean_return"] for e in evals) >= data["training"]["stop_value"]
