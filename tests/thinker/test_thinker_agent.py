"""The Thinker agent: its tree-reading actor-critic (a readout shared by the actions, real
steps that cannot reset), its policy and agent, and the bench's evaluation and statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from harness.bench import thinker_agent as bench
from mistk_rl.errors import InvalidRequest
from mistk_rl.thinker import puzzle
from mistk_rl.thinker.actor_critic import PER_ACTION, ThinkerActorCritic
from mistk_rl.thinker.tree import Layout

A, K = 4, 10


def _mdp(env_n: int = 8, **settings):
    return bench._env("thinker", [lambda: puzzle.PuzzleEnv()] * env_n, 0, settings)


def _states(env, steps: int) -> list[dict[str, torch.Tensor]]:
    """The observations of `steps` random augmented steps (real and imaginary ones)."""
    rng = np.random.default_rng(0)
    state, out = env.reset(), []
    for _ in range(steps):
        out.append({k: torch.as_tensor(v) for k, v in state.items()})
        state, *_ = env.step(rng.integers(A, size=env.env_n), rng.integers(2, size=env.env_n))
    return out


def test_real_steps_mask_the_reset_half_and_imaginary_steps_keep_all_actions():
    env = _mdp()
    model = ThinkerActorCritic(env.observation_space, 2 * A)
    real_seen = imaginary_seen = 0
    for obs in _states(env, 2 * K):
        out = model(obs)
        assert out["logit"].shape == (env.env_n, 2 * A) and out["value"].shape == (env.env_n,)
        real = obs["tree_reps"][:, Layout(A, K).slices["time"].stop - 1] == 1
        logits = out["logit"]
        assert torch.isinf(logits[real][:, A:]).all() and torch.isfinite(logits[real][:, :A]).all()
        assert torch.isfinite(logits[~real]).all()
        real_seen += int(real.sum())
        imaginary_seen += int((~real).sum())
    assert real_seen and imaginary_seen
    env.close()


def test_the_readout_is_shared_by_the_actions():
    """Permuting the actions' statistics permutes the readout's bonus the same way: one
    rule for every action, learnt once."""
    env = _mdp(env_n=4)
    model = ThinkerActorCritic(env.observation_space, 2 * A)
    torch.nn.init.normal_(model.readout.net[-1].weight)  # (it starts at zero)
    reps = _states(env, K - 1)[-1]["tree_reps"].clone()
    reps[:, Layout(A, K).slices["root_qs_max"]] = torch.tensor([5.0, -1.0, 0.5, 2.0])
    perm = torch.tensor([2, 0, 3, 1])
    permuted = reps.clone()
    for name in PER_ACTION:
        s = Layout(A, K).slices[name]
        permuted[:, s] = reps[:, s][:, perm]
    bonus, bonus_permuted = model._readout(reps), model._readout(permuted)
    assert torch.allclose(bonus_permuted[:, :A], bonus[:, :A][:, perm])
    assert torch.allclose(bonus_permuted[:, A:], bonus[:, A:][:, perm])
    assert not torch.allclose(bonus[:, 0], bonus[:, 1])  # (the statistics do matter)
    env.close()


def test_the_readout_starts_at_the_reset_prior():
    env = _mdp(env_n=2)
    model = ThinkerActorCritic(env.observation_space, 2 * A, reset_logit=-2.0)
    bonus = model._readout(_states(env, 3)[-1]["tree_reps"])
    assert torch.equal(bonus[:, :A], torch.zeros(2, A))
    assert torch.equal(bonus[:, A:], torch.full((2, A), -2.0))
    env.close()


def test_the_current_frame_is_read_when_the_mdp_returns_it():
    env = _mdp(env_n=2, return_x=True)
    assert "xs" in env.observation_space.spaces
    model = ThinkerActorCritic(env.observation_space, 2 * A)
    obs = _states(env, 3)[-1]
    moved = {**obs, "xs": torch.zeros_like(obs["xs"])}
    assert not torch.allclose(model(obs)["value"], model(moved)["value"])
    env.close()


@pytest.mark.parametrize(
    "space, action_n, match",
    [
        (spaces.Box(0, 1, (4,)), 8, "tree_reps"),
        (None, 7, "Discrete\\(2A\\)"),
    ],
)
def test_other_spaces_are_refused(space, action_n, match):
    env = _mdp(env_n=1)
    with pytest.raises(ValueError, match=match):
        ThinkerActorCritic(space or env.observation_space, action_n)
    env.close()


def test_ppo_model_keys_this_model_ignores_are_errors():
    from mistk_rl.rl.config import AgentConfigError
    from mistk_rl.thinker.policy import ThinkerPPOPolicy

    env = _mdp(env_n=1)
    with pytest.raises(AgentConfigError, match="share_encoder"):
        ThinkerPPOPolicy(
            {"model": {"share_encoder": True}}, env.observation_space, spaces.Discrete(2 * A)
        )
    env.close()


def test_the_agent_refuses_a_plain_env_with_a_400_at_initialize():
    from agents.thinker_agent import ThinkerPPOAgent
    from mistk_rl.spaces import space_to_dict

    agent = ThinkerPPOAgent()
    props = {
        "observationSpace": space_to_dict(spaces.Box(-1, 1, (4,))),
        "actionSpace": space_to_dict(spaces.Discrete(2)),
    }
    with pytest.raises(InvalidRequest, match="cannot act in these spaces"):
        agent.validate_initialize(props, {"seed": 0})


def test_a_short_training_run_learns_and_the_evaluation_plays_each_level_once():
    """Both arms train through the agent classes (policy, learner, trainer) and evaluate
    over a pool share per copy; the thinker arm's policy is the Thinker one."""
    policy, stats, _ = bench.train(
        "thinker",
        0,
        real_steps=16 * 30,
        env_n=16,
        overrides={"model": {"hidden_sizes": [16]}},
        log=None,
    )
    assert stats["updates"] >= 1  # (4,096 transitions a rollout: 16 copies x 256 steps)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    result = bench.evaluate("thinker", policy, env_n=5, pool_size=12, seed=0)
    assert result["episodes"] == 12 and 0 <= result["solved"] <= 12
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # evaluation learns nothing


def test_the_bench_bootstraps_an_episode_the_step_cap_ends_from_its_final_state(monkeypatch):
    """A truncated transition's next observation is the episode's last frame (what the
    served path bootstraps from), not the next episode's first; an unended one's is the
    observation the env copy acts on next."""
    seen: list[dict] = []
    observe = bench.OnPolicyTrainer.observe_all
    monkeypatch.setattr(
        bench.OnPolicyTrainer,
        "observe_all",
        lambda self, batch: (seen.append(batch), observe(self, batch))[1],
    )
    bench.train(
        "raw", 0, real_steps=2 * 120, env_n=2, overrides={"model": {"hidden_sizes": [8]}}, log=None
    )
    flags = {"truncated": 0, "terminated": 0, "running": 0}
    for now, later in zip(seen, seen[1:]):
        for i, t in now.items():
            same = np.array_equal(t["next_obs"]["real_states"], later[i]["obs"]["real_states"])
            if t["truncated"]:
                assert not t["terminated"] and not same
                flags["truncated"] += 1
            elif t["terminated"]:
                flags["terminated"] += 1
            else:
                assert same
                flags["running"] += 1
    assert flags["truncated"] >= 2 and flags["running"] > 100


def test_welch_interval_matches_the_t_distribution():
    from harness.stats import t_quantile, welch_interval

    # Student's t quantiles (tables): 2.776 at 4 dof, 2.228 at 10, 1.962 at 1,000
    for dof, value in ((4, 2.7764), (10, 2.2281), (1000, 1.9623)):
        assert t_quantile(0.975, dof) == pytest.approx(value, abs=1e-3)
    a, b = [0.30, 0.35, 0.41, 0.33, 0.38], [0.26, 0.22, 0.30, 0.25, 0.20]
    diff, low, high = welch_interval(a, b)
    # scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(): [.04855, .16745]
    assert (diff, low, high) == pytest.approx((0.108, 0.04855, 0.16745), abs=1e-4)


def test_the_http_config_runs_the_benchs_agent():
    """configs/puzzle_thinker_agent.yaml (the check over HTTP) and the bench's thinker arm
    train the same agent with the same hyperparameters on the same MDP."""
    from pathlib import Path

    import yaml

    config = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "puzzle_thinker_agent.yaml").read_text()
    )
    agent = config["agents"][0]
    assert agent["target"] == "agents.thinker_agent:ThinkerPPOAgent"
    policy = agent["hyperparameters"]["policy"]
    for section in ("model", "learn", "eval"):
        expected = bench.THINKER_PPO[section]
        assert policy[section].keys() == expected.keys(), section
        for key, value in expected.items():  # (floats as YAML writes them; lists exactly)
            assert policy[section][key] == (
                pytest.approx(value, rel=1e-5) if isinstance(value, float) else value
            ), key
    assert agent["hyperparameters"]["train"]["n_steps"] == bench.ROLLOUT["thinker"]
    thinker = dict(config["orchestrator"]["env"]["thinker"])
    assert thinker.pop("actions") == "Discrete" and thinker == bench.THINKER


@pytest.mark.parametrize("arm", ["thinker-learned", "thinker-vp"])
def test_an_arm_that_trains_its_model_evaluates_with_the_model_it_trained(arm):
    """thinker-learned (the learned model) and thinker-vp (the perfect model's VP-net): the
    MDP's nets train inside `step` from the agent's real steps, and the evaluation's MDP
    plans with those weights (not a fresh model's)."""
    small = {
        "model_warm_up_n": 64,
        "model_batch_size": 8,
        "model_max_replay_ratio": 1.0,
        "model_min_replay_ratio": 0.5,
    }
    policy, stats, model = bench.train(
        arm,
        0,
        real_steps=8 * 20,
        env_n=8,
        overrides={"model": {"hidden_sizes": [16]}},
        mdp=small,
        log=None,
    )
    assert model is not None and stats["model_updates"] > 0
    played = {}
    original = bench._env

    def spy(*args, **kwargs):
        env = original(*args, **kwargs)
        played["env"] = env
        return env

    bench._env = spy
    try:
        result = bench.evaluate(arm, policy, env_n=3, pool_size=3, seed=0, model=model)
    finally:
        bench._env = original
    assert result["episodes"] == 3
    evaluated = played["env"].model
    assert (model.sr is None) == (arm == "thinker-vp") and model.vp is not None
    for trained, used in ((model.sr, evaluated.sr), (model.vp, evaluated.vp)):
        if trained is None:
            assert used is None
            continue
        for (name, a), b in zip(trained.state_dict().items(), used.state_dict().values()):
            assert torch.equal(a, b), name
    figures = bench.model_figures(model, 0, arm, levels=3, accuracy_levels=2)
    assert ("model_reward" in figures) == (arm == "thinker-learned")  # (no predicted rewards)
    assert 0 <= figures["planner_on_model"] <= 1 and figures["planner_levels"] == 3
    assert "the scripted planner on its tree solves" in bench.say_model_figures(figures)


def test_unknown_arms_are_refused_by_name():
    from harness.bench import run_bench

    with pytest.raises(SystemExit, match="unknown arms thinker-typo"):
        run_bench("thinker-agent", arms=["thinker", "thinker-typo"])


def test_the_summary_gives_each_arm_its_seeds_and_each_thinker_arm_its_difference(capsys):
    rows = [
        {"arm": arm, "seed": seed, "solve_rate": rate, "episodes": 1500}
        for arm, rates in (
            ("raw", [0.26, 0.22, 0.30, 0.25, 0.20]),
            ("thinker", [0.30, 0.35, 0.41, 0.33, 0.38]),
            ("planner", [0.42, 0.41, 0.43, 0.42, 0.44]),
        )
        for seed, rate in enumerate(rates)
    ]
    bench.summarize(rows, 1000)
    out = capsys.readouterr().out
    assert "thinker seeds 0,1,2,3,4: 0.300 0.350 0.410 0.330 0.380; mean 0.354" in out
    assert "thinker - raw: +0.108, 95% interval [+0.049, +0.167]" in out
    assert "thinker - planner: -0.070, 95% interval" in out
    assert "planner - raw" not in out  # (the planner is a reference, not an arm that learns)
    assert "planner - planner" not in out and "raw - planner" not in out


def test_a_local_copy_of_the_thinker_policy_can_be_built_by_name():
    """Local inference builds the acting copy from the policy's registered name and config;
    the copy acts as the original does."""
    from mistk_rl.rl.actor import policy_class
    from mistk_rl.thinker.policy import ThinkerPPOPolicy

    env = _mdp(env_n=2)
    original = ThinkerPPOPolicy({}, env.observation_space, spaces.Discrete(2 * A), seed=0)
    copy = policy_class("ThinkerPPOPolicy")(
        original.config, env.observation_space, spaces.Discrete(2 * A), seed=1
    )
    copy.model.load_state_dict(original.model.state_dict())
    obs = _states(env, 2)[-1]
    assert torch.equal(original.model(obs)["logit"], copy.model(obs)["logit"])
    env.close()
