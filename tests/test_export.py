"""`mistk-rl export`: a run's acting network as TorchScript or ONNX, acting as the agent
does (the export checks itself; these tests check the files again, on other inputs)."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch
import yaml

from harness.config import RunConfig, RunConfigError
from harness.export import _check, export_run
from harness.run import run
from tests.conftest import REPO


def _trained(tmp_path, config_name: str, **training):
    """A short run of a repo config (its services on loopback); its run dir."""
    data = yaml.safe_load((REPO / "configs" / config_name).read_text())
    data["training"].update(eval_episodes=1, **training)
    run_dir = tmp_path / "run"
    run(RunConfig.model_validate(data), run_dir, say=lambda _: None, quiet=True)
    return run_dir


@pytest.mark.parametrize(
    "config_name, fmt",
    [
        ("cartpole_dqn.yaml", "torchscript"),
        ("pendulum_ppo.yaml", "torchscript"),
        ("pendulum_ppo.yaml", "onnx"),
    ],
)
def test_an_export_acts_as_the_agent(tmp_path, monkeypatch, config_name, fmt):
    """DQN (discrete) to TorchScript; PPO with observation normalisation (continuous, the
    normaliser folded in) to both (a Gaussian's actions come out of TorchScript detached)."""
    if fmt == "onnx":
        pytest.importorskip("onnx")
    monkeypatch.chdir(REPO)  # (the services import agents/ from here)
    run_dir = _trained(tmp_path, config_name, env_steps=600, eval_every=600)
    out = tmp_path / f"acting.{fmt}"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    done = export_run(run_dir, fmt, out)
    assert done["model"] == "final.pt" and out.is_file()
    assert not list(scratch.glob("mistk-export-*"))  # (the agent's scratch directory went)
    from harness.export import _load_agent

    agent, _, _ = _load_agent(run_dir, None, scratch)
    space = agent.policy.observation_space
    space.seed(123)
    rows = np.stack([space.sample() for _ in range(50)]).astype(np.float32)
    expected, _ = agent.actor.act(rows, None, mode="eval", env_steps=0, warming_up=False)
    if fmt == "torchscript":
        got = torch.jit.load(str(out))(torch.as_tensor(rows)).numpy()
    else:
        from onnx.reference import ReferenceEvaluator

        got = ReferenceEvaluator(str(out)).run(None, {"obs": rows})[0]
    np.testing.assert_allclose(got.reshape(expected.shape), expected, atol=1e-5)
    if agent.normalizer is not None:  # (pendulum: the statistics moved in training)
        assert agent.normalizer.norm_obs and np.any(agent.normalizer.obs_rms.var != 1.0)


def test_what_cannot_be_exported_says_why(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(RunConfigError, match="no run directory"):
        export_run(tmp_path, "torchscript", tmp_path / "x.pt")
    run_dir = tmp_path / "random"
    data = yaml.safe_load((REPO / "configs" / "cartpole_random.yaml").read_text())
    run(RunConfig.model_validate(data), run_dir, say=lambda _: None, quiet=True)
    with pytest.raises(RunConfigError, match="has no network to export"):
        export_run(run_dir, "torchscript", tmp_path / "x.pt")
    with pytest.raises(RuntimeError, match="acts differently from the agent on 1 of 3"):
        _check(np.array([0, 1, 1]), np.array([0, 1, 0]), "p")
