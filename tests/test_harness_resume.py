"""`mistk-rl run --resume RUN_DIR`: a training run that died after an evaluation continues
from that evaluation's checkpoint over real services, without redoing what it had done."""
from __future__ import annotations

import csv
import json

import pytest
import yaml

from harness.config import ConfigError, RunConfig, resume_config
from harness.run import run, run_from_file
from harness.training import Progress, resumed_seed
from mistk_rl.rl.learner import load_checkpoint
from tests.conftest import GYM_ORCHESTRATOR, REPO

TINY = {
    "name": "tiny", "orchestrator": {"target": GYM_ORCHESTRATOR, "env": {"id": "CartPole-v1"}},
    "agents": [{"name": "player", "target": "agents.dqn_agent:DQNAgent", "save_path": "final.pt",
                "hyperparameters": {"seed": 0, "log_every": 10,
                                    "policy": {"model": {"hidden_sizes": [32]}},
                                    "train": {"learning_starts": 100, "train_freq": 50,
                                              "gradient_steps": 10}}}],
    "training": {"env_steps": 400, "eval_every": 200, "eval_episodes": 2, "max_steps": 50,
                 "num_envs": 2, "checkpoints": 1}}


class Crash(Exception):
    """Stands for the harness dying right after the first evaluation's checkpoint."""


def _crash_at_first_eval(msg: str) -> None:
    if "eval at" in msg:
        raise Crash(msg)


def test_resume_continues_after_the_first_evaluation(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    with pytest.raises(Crash):
        run(RunConfig.model_validate(TINY), run_dir, say=_crash_at_first_eval)
    cut = Progress.load(run_dir)
    agent_dir = run_dir / "data" / "player"
    assert cut.train_steps == 200 and len(cut.evals) == 1 and not cut.done
    assert cut.checkpoints == {"player": "checkpoints/step-200.pt"}
    assert load_checkpoint(agent_dir / "checkpoints" / "step-200.pt")["learner"]["env_steps"] == 200
    assert not (run_dir / "results.json").exists()

    assert run_from_file(None, resume=run_dir, quiet=True) == 0

    results = json.loads((run_dir / "results.json").read_text())
    evals = results["evals"]
    assert [e["env_steps"] for e in evals] == [200, 400]
    assert evals[0] == cut.evals[0] and results["resumed_at"] == [200]  # not redone
    assert [e["wall_s"] for e in evals] == sorted(e["wall_s"] for e in evals)
    # the episodes cover the whole run: those up to the checkpoint, then the resumed ones
    episodes = results["episodes"]
    assert episodes[:len(cut.episodes)] == cut.episodes
    assert [e["episode"] for e in episodes] == list(range(len(episodes)))
    assert sum(not e["train"] for e in episodes) == 2 * 2  # 2 episodes per evaluation
    # the resumed training envs started new episodes, seeded from the seed and evals done
    resumed = [e for e in episodes[len(cut.episodes):] if e["train"] and "seed" in e]
    assert sorted(e["seed"] for e in resumed) == [resumed_seed(0, 1) + i for i in range(2)]
    # the agent went on from its checkpoint: 400 env steps in all, one checkpoint kept
    assert load_checkpoint(agent_dir / "final.pt")["learner"]["env_steps"] == 400
    assert sorted(p.name for p in (agent_dir / "checkpoints").iterdir()) == ["step-400.pt"]
    assert Progress.load(run_dir).checkpoints == {"player": "checkpoints/step-400.pt"}
    with open(run_dir / "evals.csv", newline="") as fh:
        assert [row["env_steps"] for row in csv.DictReader(fh)] == ["200", "400"]
    with open(agent_dir / "logs" / "learner.csv", newline="") as fh:
        iters = [int(row["train_iter"]) for row in csv.DictReader(fh)]
    assert iters == sorted(set(iters))  # no rows logged twice across the crash


def test_resume_refuses_another_config_and_a_run_without_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(TINY))
    longer = tmp_path / "longer.yaml"
    longer.write_text(yaml.safe_dump({**TINY, "training": {**TINY["training"],
                                                           "env_steps": 900}}))
    with pytest.raises(ConfigError, match=r"differs .* in training\.env_steps: --resume"):
        resume_config(run_dir, longer)
    with pytest.raises(ConfigError, match=r"in agents\.0\.hyperparameters\.seed, "
                                          r"training\.seed"):
        resume_config(run_dir, seed=3)
    assert resume_config(run_dir, seed=0).training.env_steps == 400
    with pytest.raises(ConfigError, match="no progress.json"):
        Progress.load(run_dir)
    assert run_from_file(None, resume=run_dir, quiet=True) == 1
