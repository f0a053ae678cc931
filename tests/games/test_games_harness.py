"""Games through the harness: game training with evaluations, `mistk-rl eval` on its run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.cli import main as cli
from harness.config import RunConfig, RunConfigError, load_config
from harness.run import read_episodes, run

SELF_PLAY = {
    "name": "ttt",
    "orchestrator": {
        "target": "orchestrators.game_orchestrator:GameOrchestrator",
        "env": {"id": "classic/tictactoe-v3"},
    },
    "agents": [
        {
            "name": "learner",
            "target": "agents.dqn_agent:DQNAgent",
            "seats": ["player_1", "player_2"],
            "save_path": "final.pt",
            "hyperparameters": {
                "seed": 0,
                "policy": {"model": {"hidden_sizes": [32]}},
                "train": {"learning_starts": 100, "train_freq": 16, "gradient_steps": 2},
            },
        },
        {
            "name": "random",
            "target": "agents.opponent_agents:MaskedRandomAgent",
            "train": False,
            "hyperparameters": {"seed": 1},
        },
    ],
    "game_training": {"agent_steps": 400, "eval_every": 200, "num_envs": 8},
    "evaluation": {
        "agent": "learner",
        "num_envs": 8,
        "against": [
            {"opponent": "tictactoe_perfect", "exhaustive": True},
            {"opponent": "random", "games_per_seat": 20},
        ],
    },
}


@pytest.mark.long(22)
def test_game_training_evaluates_resumes_and_eval_reruns_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = {**SELF_PLAY, "game_training": {**SELF_PLAY["game_training"], "agent_steps": 200}}
    run_dir = tmp_path / "run"
    run(RunConfig.model_validate(first), run_dir, say=lambda m: None, quiet=True)
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["agent_steps"] >= 200 and len(progress["evals"]) == 1
    assert progress["checkpoints"]["learner"].startswith("checkpoints/step-")
    # a longer budget, continued from the checkpoint of the first evaluation
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved["game_training"]["agent_steps"] = 400
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    assert cli(["run", "--resume", str(run_dir), "--quiet"]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    evals = results["evals"]
    assert evals[0] == progress["evals"][0]  # the history before the resume is kept
    assert len(evals) == 2 and evals[0]["agent_steps"] >= 200 and evals[1]["agent_steps"] >= 400
    assert results["evaluation"] == evals[-1]["evaluation"]
    perfect = results["evaluation"]["tictactoe_perfect"]
    assert perfect["exhaustive"] and set(perfect["seats"]) == {"player_1", "player_2"}
    for r in perfect["seats"].values():
        assert r["win"] == 0  # nobody beats the perfect player
        assert r["win"] + r["draw"] + r["loss"] == pytest.approx(1)
    sampled = results["evaluation"]["random"]
    assert not sampled["exhaustive"]
    # self-play: neither opponent is one it trains against
    assert not perfect["trained_against"] and not sampled["trained_against"]
    assert [r["games"] for r in sampled["seats"].values()] == [20, 20]
    rows = (tmp_path / "run" / "evals.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 2  # header + evaluations x matchups x seats
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 1000
    # TensorBoard: each matchup and seat at the evaluated agent's moves, across the resume
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    wins = events.Scalars("eval/tictactoe_perfect/player_1/win")
    assert [w.step for w in wins] == [e["agent_steps"] for e in evals]
    assert "eval/tictactoe_perfect/player_2/lost_lines" in events.Tags()["scalars"]
    # self-play: the bench agent never played during training, only in its evaluations
    training_games = [e for e in read_episodes(tmp_path / "run") if e["train"]]
    assert training_games and all(set(e["seats"].values()) == {"learner"} for e in training_games)
    # only the games since the resume (a new orchestrator: 200 more moves, a game each over)
    assert max(e["envSteps"] for e in training_games) < 200 + 8 * 9 + 1

    (tmp_path / "ttt.yaml").write_text(yaml.safe_dump(SELF_PLAY))
    assert cli(["eval", str(tmp_path / "ttt.yaml"), "--run", str(tmp_path / "run"), "--quiet"]) == 0
    again = json.loads((tmp_path / "run" / "evaluation.json").read_text())["evaluation"]
    # the same saved model, greedy: the enumerated matchup comes out exactly the same
    assert again["tictactoe_perfect"] == perfect
    # without save_path the learner loads the checkpoint of the run's last evaluation (the
    # same weights: training ended there), not an untrained model
    unsaved = {
        **SELF_PLAY,
        "agents": [
            {k: v for k, v in SELF_PLAY["agents"][0].items() if k != "save_path"},
            SELF_PLAY["agents"][1],
        ],
    }
    (tmp_path / "unsaved.yaml").write_text(yaml.safe_dump(unsaved))
    said: list[str] = []
    monkeypatch.setattr(
        "builtins.print", lambda *parts, **_: said.append(" ".join(map(str, parts)))
    )
    assert cli(["eval", str(tmp_path / "unsaved.yaml"), "--run", str(tmp_path / "run")]) == 0
    last = json.loads((run_dir / "progress.json").read_text())["checkpoints"]["learner"]
    assert f"agent learner: the model in {last}" in said, said
    from_checkpoint = json.loads((run_dir / "evaluation.json").read_text())["evaluation"]
    assert from_checkpoint["tictactoe_perfect"] == perfect


def test_an_opponent_it_trains_against_is_marked_and_held_out_refuses_it(tmp_path, monkeypatch):
    """The learner holds player_1 and the random agent takes the next free seat, so it
    trains against random: those figures say so in results, evals.csv, the log line and
    the curve's legend. With ``evaluation.held_out`` the run stops before it trains."""
    monkeypatch.chdir(tmp_path)
    learner = {**SELF_PLAY["agents"][0], "seats": ["player_1"]}
    config = {
        **SELF_PLAY,
        "agents": [learner, SELF_PLAY["agents"][1]],
        "game_training": {"agent_steps": 60, "eval_every": 60, "num_envs": 4},
        "evaluation": {
            "agent": "learner",
            "num_envs": 4,
            "against": [
                {"opponent": "random", "games_per_seat": 4},
                {"opponent": "tictactoe_perfect", "exhaustive": True},
            ],
        },
    }
    said: list[str] = []
    results = run(RunConfig.model_validate(config), tmp_path / "run", say=said.append)
    evaluation = results["evaluation"]
    assert evaluation["random"]["trained_against"] is True
    assert evaluation["tictactoe_perfect"]["trained_against"] is False
    assert any("random also trained against" in line for line in said), said
    assert any("vs random (trained against): " in line for line in said), said
    rows = (tmp_path / "run" / "evals.csv").read_text().splitlines()
    assert rows[0].endswith(",trained_against")
    assert {r.split(",")[2]: r.split(",")[-1] for r in rows[1:]} == {
        "random": "1",
        "tictactoe_perfect": "0",
    }

    held_out = {**config, "evaluation": {**config["evaluation"], "held_out": True}}
    with pytest.raises(RunConfigError, match="held_out: the agent trains against random"):
        run(RunConfig.model_validate(held_out), tmp_path / "held", say=said.append, quiet=True)
    assert not (tmp_path / "held" / "progress.json").exists()  # (refused before training)


def test_training_opponents_of_a_league_and_of_a_lineup():
    """A league trains its main player against its other players, pool and fixed
    opponents; game training against its lineup (or the seat holders the orchestrator
    bound), never against the evaluated agent itself."""
    from harness.games import check_held_out, shown_as, summary, training_opponents

    repo = Path(__file__).resolve().parents[2]
    league = load_config(repo / "configs" / "connect4_league.yaml")
    assert training_opponents(league, {}) == {"frozen_0", "frozen_1", "random", "winblock"}
    held_out = load_config(repo / "configs" / "connect4_league_heldout.yaml")
    assert held_out.evaluation is not None and held_out.evaluation.held_out
    assert training_opponents(held_out, {}) == {"main_exploiter", "frozen_0", "frozen_1"}
    check_held_out(held_out.evaluation, training_opponents(held_out, {}))  # (no refusal)
    ttt = load_config(repo / "configs" / "tictactoe_league.yaml")
    assert "main" not in training_opponents(ttt, {})
    lineup = RunConfig.model_validate(
        {
            **SELF_PLAY,
            "game_training": {
                **SELF_PLAY["game_training"],
                "lineup": {"player_1": "learner", "player_2": "random"},
            },
        }
    )
    assert training_opponents(lineup, {"seatHolders": {}}) == {"random"}
    self_play = RunConfig.model_validate(SELF_PLAY)
    holders = {"seatHolders": {"player_1": "learner", "player_2": "learner"}}
    assert training_opponents(self_play, holders) == frozenset()
    assert self_play.evaluation is not None
    check_held_out(self_play.evaluation, frozenset({"random"}))  # (not held_out: no refusal)
    strict = self_play.evaluation.model_copy(update={"held_out": True})
    check_held_out(strict, frozenset({"someone_else"}))
    with pytest.raises(RunConfigError, match="trains against random"):
        check_held_out(strict, frozenset({"random", "someone_else"}))
    marked = {"exhaustive": False, "trained_against": True, "seats": {}}
    assert shown_as("random", marked) == "random (trained against)"
    assert shown_as("random", {**marked, "trained_against": False}) == "random"
    line = summary({"random": {**marked, "seats": {"p": {"win": 1, "draw": 0, "loss": 0}}}})
    assert line == "vs random (trained against): p 1.000/0.000/0.000"


def test_the_last_checkpoint_of_a_game_run_is_found_as_a_gym_runs_is(tmp_path):
    """`mistk-rl eval --run` and `mistk-rl export` take it when no model was saved: read
    from the progress.json of the run's own kind (a game run's has other fields)."""
    from harness.games import GameProgress
    from harness.run import last_checkpoint

    config = RunConfig.model_validate(SELF_PLAY)
    learner = config.agents[0]
    where = tmp_path / "data" / "learner"
    (where / "checkpoints").mkdir(parents=True)
    (where / "checkpoints" / "step-200.pt").write_bytes(b"weights")
    GameProgress(agent_steps=200, checkpoints={"learner": "checkpoints/step-200.pt"}).save(tmp_path)
    dirs = {"learner": where}
    assert last_checkpoint(config, learner, tmp_path, dirs) == "checkpoints/step-200.pt"
    assert last_checkpoint(config, learner, tmp_path, {}) is None  # (not started here)
    gym = load_config(Path(__file__).resolve().parents[2] / "configs" / "cartpole_dqn.yaml")
    assert last_checkpoint(gym, gym.agents[0], tmp_path, {gym.agents[0].name: where}) is None


def test_config_checks_the_evaluation(tmp_path):
    bad = {
        **SELF_PLAY,
        "evaluation": {
            "agent": "learner",
            "against": [{"opponent": "nobody", "games_per_seat": 10}],
        },
    }
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(RunConfigError, match="nobody"):
        load_config(tmp_path / "bad.yaml")
    no_eval = {k: v for k, v in SELF_PLAY.items() if k != "evaluation"}
    (tmp_path / "no_eval.yaml").write_text(yaml.safe_dump(no_eval))
    with pytest.raises(RunConfigError, match="game_training needs 'evaluation'"):
        load_config(tmp_path / "no_eval.yaml")


@pytest.mark.parametrize(
    "name",
    [
        "tictactoe_selfplay_dqn",
        "tictactoe_vs_random",
        "connect4_selfplay_ppo",
        "tictactoe_selfplay_dqn_sym",
        "tictactoe_league",
        "connect4_league",
        "connect4_league_heldout",
        "connect4_vs_winblock_ppo",
    ],
)
def test_shipped_game_configs_are_valid(name):
    """The configs load, and each agent accepts its hyperparameters (a misspelt key would
    be a 400 at initialize, minutes into nothing)."""
    import importlib

    config = load_config(Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml")
    assert config.game_training is not None and config.evaluation is not None
    for agent in config.agents:
        module, cls = agent.target.split(":")
        impl = getattr(importlib.import_module(module), cls)()
        impl.validate_initialize(agent.properties, agent.hyperparameters)
