"""A solo league over HTTP: a league orchestrator, two gym-orchestrator workers and one DQN
player on CartPole-v1, sharing one league directory."""

from __future__ import annotations

import json

import pytest

from mistk_rl.deploy.launch import wait_ready
from mistk_rl.sdk.client import BadRequest

LEAGUE = "orchestrators.league_orchestrator:LeagueOrchestrator"
GYM = "orchestrators.gym_orchestrator:GymOrchestrator"
DQN = "agents.dqn_agent:DQNAgent"
SMALL_DQN = {
    "seed": 0,
    "policy": {"model": {"hidden_sizes": [32]}},
    "train": {"learning_starts": 50, "train_freq": 16, "gradient_steps": 2},
    "buffer": {"replay_buffer_size": 2000},
    "checkpoint_buffer": False,
}
LEARNER = {
    "id": "learner",
    "type": "solo",
    "numEnvs": 2,
    "episodesPerJob": 4,
    "epsStart": 0.9,
    "epsEnd": 0.1,
    "epsDecay": 300,
    "envKwargs": {"max_episode_steps": 40},
}


def _env(workers, players=(LEARNER,)):
    return {
        "id": "CartPole-v1",
        "league": {
            "players": list(players),
            "workers": workers,
            "directory": "league",
            "onePhaseStep": 150,
            "seed": 0,
        },
    }


def test_a_solo_league_trains_on_gym_workers_and_resumes(launch, tmp_path):
    share = ["--share", f"league={tmp_path / 'shared'}"]
    services = [launch("orchestrator", GYM, wait=False) for _ in range(2)] + [
        launch("agent", DQN, extra_args=share, wait=False),
        launch("orchestrator", LEAGUE, extra_args=share, wait=False),
    ]
    for service in services:  # (booted side by side)
        wait_ready(service, 60)
    workers = [s.url for s in services[:2]]
    agent = services[2].client()
    agent.initialize(hyperparameters=SMALL_DQN)
    agent.build_model()
    league = services[3].client()
    with pytest.raises(BadRequest, match="not a mix"):
        league.initialize(_env(workers, [LEARNER, {"id": "main", "type": "main"}]), agents_needed=2)
    with pytest.raises(BadRequest, match="1 workers for 2 solo players"):
        league.initialize(_env(workers[:1], [LEARNER, {**LEARNER, "id": "other"}]), agents_needed=2)
    league.initialize(_env(workers), agents_needed=1)
    with pytest.raises(BadRequest, match="no frozen agents"):
        league.register_agent("frozen", services[2].url, skip_train=True)
    league.register_agent("learner", services[2].url)

    league.start_episode({"numSteps": 400}, wait=True, timeout=300)
    league.stop_episode()
    view = league.get_league()
    finished = [job for job in view.jobs["recent"] if "failed" not in job]
    assert finished and view.jobs["failed"] == 0
    assert all(job["results"]["episodes"] == 4 and job["branch"] == "solo" for job in finished)
    episodes = league.get_results().episodes
    assert len(episodes) == 4 * len(finished)
    assert all(e.length <= 40 for e in episodes)  # the player's env kwargs
    # the player's steps are the env steps its jobs played, and its agent trained on them
    steps = sum(e.length for e in episodes)
    (row,) = [p for p in view.players if p["id"] == "learner"]
    assert row["steps"] == steps >= 400
    status = league.status().payload
    assert status["agentSteps"] == {"learner": steps} and status["envSteps"] == steps
    assert agent.status().payload["envSteps"] == steps
    # SoloSharedPayoff has every job; the epsilon decays with the player's steps
    solo = view.payoff["solo"]["learner"]
    assert [j["job_id"] for j in solo] == [j["job_id"] for j in finished]
    assert sum(j["steps"] for j in solo) == steps
    epsilons = [j["epsilon"] for j in solo]
    assert epsilons[0] == pytest.approx(0.9) and epsilons == sorted(epsilons, reverse=True)
    # the workers: each bound to the player, both used (jobs go least recently used first)
    assert [w.player for w in view.workers] == ["learner", "learner"]
    assert all(w.jobs >= 1 and w.failed == 0 for w in view.workers)
    # a snapshot once the player made a phase (150 steps) since its last one
    at = sorted(p["steps"] for p in view.players if p["kind"] == "HistoricalPlayer")
    assert at and at[0] >= 150 and all(b - a >= 150 for a, b in zip(at, at[1:]))
    shared = tmp_path / "shared"
    state = json.loads((shared / "league.json").read_text())
    assert state["solo_payoff"]["jobs"]["learner"] == solo
    for snapshot in state["historical"]:  # every snapshot's checkpoint is on disk
        assert (shared / snapshot["checkpoint_path"].removeprefix("league/")).exists()

    # a new league orchestrator given the same directory continues the same league
    league.terminate()
    again = launch("orchestrator", LEAGUE, extra_args=share).client()
    again.initialize(_env(workers), agents_needed=1)
    assert again.status().payload["agentSteps"] == {"learner": steps}
    again.register_agent("learner", services[2].url)
    again.start_episode({"numEpisodes": 4}, wait=True, timeout=120)
    again.stop_episode()
    resumed = again.get_league()
    assert resumed.jobs["launched"] == view.jobs["launched"] + 1
    more = sum(e.length for e in again.get_results().episodes)
    (row,) = [p for p in resumed.players if p["id"] == "learner"]
    assert row["steps"] == steps + more
    assert len(resumed.payoff["solo"]["learner"]) == len(solo) + 1
    assert resumed.payoff["solo"]["learner"][-1]["epsilon"] < epsilons[-1]
    again.reset()


TINY_RUN = {
    "name": "tiny_solo_league",
    "orchestrator": {
        "target": LEAGUE,
        "env": {
            "id": "CartPole-v1",
            "league": {
                "players": [{**LEARNER, "envKwargs": {"max_episode_steps": 30}}],
                "onePhaseStep": 150,
                "seed": 0,
            },
        },
    },
    "workers": [{"target": GYM}],
    "agents": [{"name": "learner", "target": DQN, "hyperparameters": SMALL_DQN}],
    "training": {
        "env_steps": 400,
        "eval_every": 200,
        "eval_episodes": 2,
        "max_steps": 30,
        "checkpoints": 1,
    },
}


class Crash(Exception):
    """Stands for the harness dying right after the first evaluation's checkpoint."""


def _crash_at_first_eval(msg: str) -> None:
    if "eval at" in msg:
        raise Crash(msg)


def test_the_harness_trains_a_solo_league_evaluates_it_and_resumes_it(tmp_path, monkeypatch):
    from harness.config import RunConfig
    from harness.run import run, run_from_file
    from harness.training import Progress
    from tests.conftest import REPO

    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    with pytest.raises(Crash):
        run(RunConfig.model_validate(TINY_RUN), run_dir, say=_crash_at_first_eval)
    cut = Progress.load(run_dir)
    (first,) = cut.evals
    assert first["env_steps"] == cut.train_steps >= 200  # (jobs are whole: past the point)
    assert set(first["players"]) == {"learner"} and first["best"] == "learner"
    assert len(first["returns"]) == 2 and all(r <= 30 for r in first["returns"])
    assert cut.checkpoints == {"learner": f"checkpoints/step-{cut.train_steps}.pt"}
    league_file = run_dir / "league" / "league.json"
    state = json.loads(league_file.read_text())
    assert state["active"][0]["total_agent_step"] == cut.train_steps

    assert run_from_file(None, resume=run_dir, quiet=True) == 0
    results = json.loads((run_dir / "results.json").read_text())
    evals = results["evals"]
    assert len(evals) == 2 and evals[0] == first and results["resumed_at"] == [cut.train_steps]
    assert evals[-1]["env_steps"] >= 400
    (row,) = [p for p in results["league"]["players"] if p["id"] == "learner"]
    assert row["steps"] == evals[-1]["env_steps"]  # the league went on from its directory
    solo = results["league"]["payoff"]["solo"]["learner"]
    assert sum(j["steps"] for j in solo) == row["steps"]
    assert (run_dir / "learning_curve.png").exists()
    assert Progress.load(run_dir).checkpoints == {
        "learner": f"checkpoints/step-{evals[-1]['env_steps']}.pt"
    }
