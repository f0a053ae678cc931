"""`mistk-rl run --resume RUN_DIR`: a training run that died after an evaluation continues
from that evaluation's checkpoint over real services, without redoing what it had done."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from harness.config import RunConfig, RunConfigError, resume_config
from harness.run import read_episodes, run, run_from_file
from harness.training import Progress, resumed_seed
from mistk_rl.rl.learner import load_checkpoint
from tests.conftest import GYM_ORCHESTRATOR, REPO

TINY = {
    "name": "tiny",
    "orchestrator": {"target": GYM_ORCHESTRATOR, "env": {"id": "CartPole-v1"}},
    "agents": [
        {
            "name": "player",
            "target": "agents.dqn_agent:DQNAgent",
            "save_path": "final.pt",
            "hyperparameters": {
                "seed": 0,
                "log_every": 10,
                "policy": {"model": {"hidden_sizes": [32]}},
                "train": {"learning_starts": 100, "train_freq": 50, "gradient_steps": 10},
            },
        }
    ],
    "training": {
        "env_steps": 400,
        "eval_every": 200,
        "eval_episodes": 2,
        "max_steps": 50,
        "num_envs": 2,
        "checkpoints": 1,
    },
}


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
    saved = read_episodes(run_dir)  # appended at the checkpoint
    assert len(saved) == cut.episodes_saved > 0

    assert run_from_file(None, resume=run_dir, quiet=True) == 0

    results = json.loads((run_dir / "results.json").read_text())
    evals = results["evals"]
    assert [e["env_steps"] for e in evals] == [200, 400]
    assert evals[0] == cut.evals[0] and results["resumed_at"] == [200]  # not redone
    assert [e["wall_s"] for e in evals] == sorted(e["wall_s"] for e in evals)
    # the episodes cover the whole run: those up to the checkpoint, then the resumed ones
    episodes = read_episodes(run_dir)
    assert results["episode_count"] == len(episodes)
    assert episodes[: len(saved)] == saved
    assert [e["episode"] for e in episodes] == list(range(len(episodes)))
    assert sum(not e["train"] for e in episodes) == 2 * 2  # 2 episodes per evaluation
    # the resumed training envs started new episodes, seeded from the seed and evals done
    resumed = [e for e in episodes[len(saved) :] if e["train"] and "seed" in e]
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

    before = _snapshot(run_dir)  # resumed again, finished: it says so and touches nothing
    assert run_from_file(None, resume=run_dir, quiet=True) == 0
    assert _snapshot(run_dir) == before


def _snapshot(run_dir):
    """Every file and directory under `run_dir`: its bytes (files) and mtime."""
    return {
        str(p.relative_to(run_dir)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
    }


def _finished_run(run_dir, config: dict, progress: dict | None) -> None:
    """A run dir as a run that finished leaves it."""
    (run_dir / "data" / "player" / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if progress is not None:
        (run_dir / "progress.json").write_text(json.dumps(progress))
        (run_dir / "data" / "player" / "checkpoints" / "step-400.pt").write_bytes(b"model")
    (run_dir / "results.json").write_text(json.dumps({"name": config["name"], "episodes": []}))
    (run_dir / "data" / "player" / "final.pt").write_bytes(b"final model")
    (run_dir / "evals.csv").write_text("env_steps\n200\n400\n")


@pytest.mark.parametrize(
    "config, progress, says",
    [
        (
            TINY,
            {"train_steps": 400, "checkpoints": {"player": "checkpoints/step-400.pt"}},
            "it trained 400 of 400 env steps",
        ),
        (
            TINY,
            {
                "train_steps": 200,
                "done": True,
                "checkpoints": {"player": "checkpoints/step-400.pt"},
            },
            "an evaluation met its stop target after 200 env steps",
        ),
        (
            {**TINY, "training": {**TINY["training"], "checkpoints": 0}},
            None,
            "it trained to its end",
        ),
        (
            {key: value for key, value in TINY.items() if key != "training"},
            None,
            "it ran every episode block",
        ),
    ],
)
def test_resuming_a_finished_run_says_so_and_rewrites_nothing(
    tmp_path, monkeypatch, capsys, config, progress, says
):
    """A finished run resumed again started its services, rewrote config.yaml and went on
    to load its checkpoint and save over its model and results."""
    from harness.cli import main

    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    _finished_run(run_dir, config, progress)
    before = _snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert f"the run in {run_dir} has finished ({says}): nothing to resume" in err, err
    assert str(run_dir / "results.json") in err
    assert _snapshot(run_dir) == before


def test_a_finished_run_whose_config_asks_for_more_is_not_finished(tmp_path):
    from harness.run import _finished

    run_dir = tmp_path / "run"
    _finished_run(run_dir, TINY, {"train_steps": 400})
    longer = RunConfig.model_validate({**TINY, "training": {**TINY["training"], "env_steps": 800}})
    assert _finished(longer, run_dir) is None  # RUN_DIR/config.yaml edited: go on training
    assert _finished(RunConfig.model_validate(TINY), run_dir) == "it trained 400 of 400 env steps"
    (run_dir / "results.json").unlink()  # died after training, before its results: resume
    assert _finished(RunConfig.model_validate(TINY), run_dir) is None


def test_resume_refuses_another_config_and_a_run_without_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(TINY))
    longer = tmp_path / "longer.yaml"
    longer.write_text(yaml.safe_dump({**TINY, "training": {**TINY["training"], "env_steps": 900}}))
    with pytest.raises(RunConfigError, match=r"differs .* in training\.env_steps: --resume"):
        resume_config(run_dir, longer)
    with pytest.raises(
        RunConfigError,
        match=r"in agents\.0\.hyperparameters\.seed, "
        r"training\.seed",
    ):
        resume_config(run_dir, seed=3)
    assert resume_config(run_dir, seed=0).training.env_steps == 400
    with pytest.raises(RunConfigError, match="no progress.json"):
        Progress.load(run_dir)
    assert run_from_file(None, resume=run_dir, quiet=True) == 1
