"""The learned model (wrapper_type 0): value targets, the prioritized replay, training inside
`step` at the replay ratio, checkpoints resumed by experiment id, and a model that learns the
chain's rewards and frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mistk_rl.thinker import load_config, make
from mistk_rl.thinker.model import ThinkerModel
from mistk_rl.thinker.model_learner import CHECKPOINT, ModelReplay, alive_mask, value_targets
from mistk_rl.thinker.tree import decode_tree_reps
from tests.thinker.chain import CELLS, Chain

SMALL = dict(
    wrapper_type=0,
    rec_t=4,
    max_depth=3,
    discounting=0.5,
    model_unroll_len=2,
    model_batch_size=8,
    model_buffer_n=400,
    model_warm_up_n=40,
    model_min_replay_ratio=2.0,
    model_max_replay_ratio=3.0,
    model_lr=3e-3,
    seed=0,
)


def learned(env_n: int = 2, **cfg):
    return make(env_fn=Chain, env_n=env_n, **{**SMALL, **cfg})


def play(env, real_steps: int, seed: int = 0) -> dict:
    """Random stages until `real_steps` real steps; checks every output is finite."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < real_steps:
        state, reward, _, info = env.step(
            rng.integers(2, size=env.env_n), rng.integers(2, size=env.env_n)
        )
        assert all(np.isfinite(v).all() for v in state.values())
        assert np.isfinite(reward).all() and np.isfinite(info["baseline"]).all()
        done += int(info["step_status"][0] == 0)
    return info


# ---- value targets --------------------------------------------------------------------------
def test_value_targets_bootstrap_from_the_state_n_steps_on():
    """target_i = r_i + g r_{i+1} + g^2 V(s_{i+2}) for n = 2: V of s_{i+n}, not s_{i+n-1}
    (v1.1 bootstraps one step early)."""
    g = 0.5
    rewards = np.array([[1.0, 2.0, 4.0, 8.0, 16.0]])
    baselines = np.array([[10.0, 20.0, 30.0, 40.0, 50.0]])
    no = np.zeros_like(rewards, dtype=bool)
    out = value_targets(rewards, no, no, baselines, g, n=2, k=2)
    expected = [1 + g * 2 + g * g * 30, 2 + g * 4 + g * g * 40, 4 + g * 8 + g * g * 50]
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)


def test_value_targets_stop_at_a_termination_and_bootstrap_at_a_truncation():
    g = 0.5
    rewards = np.array([[1.0, 2.0, 4.0, 8.0]] * 2)
    baselines = np.array([[10.0, 20.0, 30.0, 40.0]] * 2)
    dones = np.array([[False, True, False, False]] * 2)
    truncated = np.array([[False, False, False, False], [False, True, False, False]])
    out = value_targets(rewards, dones, truncated, baselines, g, n=2, k=1)
    assert out[0, 0] == pytest.approx(1 + g * 2)  # terminated at 1: no bootstrap
    assert out[1, 0] == pytest.approx(1 + g * 20)  # truncated at 1: V_tree(s_1) for r_1 on
    assert out[0, 1] == pytest.approx(2)
    np.testing.assert_array_equal(alive_mask(dones, 2), [[True, True, False]] * 2)


# ---- the replay -----------------------------------------------------------------------------
def _filled(t: int, length: int = 6, window: int = 3) -> ModelReplay:
    replay = ModelReplay(2, length, window, (1,), np.dtype(np.float32), 2, False, alpha=0.6)
    for i in range(t):
        replay.add(
            frames=np.full((2, 1), i, np.float32),
            prev_actions=np.zeros(2),
            actions=np.zeros(2),
            rewards=np.full(2, i),
            dones=np.zeros(2, bool),
            truncated=np.zeros(2, bool),
            baselines=np.zeros(2),
            probs=None,
        )
    return replay


def test_replay_draws_only_complete_windows_inside_the_ring():
    assert not _filled(2).ready  # no window of 3 yet
    replay = _filled(11)  # entries 5..10 kept; windows start at 5..8
    w = replay.sample(64, 0.4, np.random.default_rng(0), k=1)
    starts = w.rewards[:, 0]
    assert set(starts.tolist()) <= {5.0, 6.0, 7.0, 8.0}
    np.testing.assert_array_equal(w.rewards, starts[:, None] + np.arange(3))  # consecutive
    assert w.frames.shape == (64, 2, 1)  # frames of s_0 .. s_k only
    assert np.all(w.weights > 0) and np.isfinite(w.weights).all()


def test_replay_priorities_steer_sampling_and_survive_a_round_trip():
    replay = _filled(11)
    leaves = np.flatnonzero(replay.priorities.drawable())  # the drawable starts
    assert sorted(leaves) == [0, 1, 2, 5, 6, 7, 8, 11]
    replay.update_priorities(leaves, np.where(leaves == 7, 10.0, 0.1))  # slot 1 of env 1
    w = replay.sample(256, 1.0, np.random.default_rng(0), k=1)
    share = 10.0**0.6 / (10.0**0.6 + 7 * 0.1**0.6)
    assert np.mean(w.leaves == 7) == pytest.approx(share, abs=0.05)
    assert w.weights[w.leaves == 7].max() < w.weights[w.leaves != 7].min()  # IS weights
    copy = ModelReplay.from_state(replay.state_dict(), alpha=0.6)
    again = copy.sample(256, 1.0, np.random.default_rng(0), k=1)
    np.testing.assert_array_equal(again.leaves, w.leaves)
    np.testing.assert_array_equal(again.rewards, w.rewards)


# ---- the model inside the MDP ---------------------------------------------------------------
def test_an_untrained_zero_headed_model_answers_zero():
    env = learned(train_model=False)
    state = env.reset()
    root = env.roots[0]
    assert root.v == 0 and not any(child.logit for child in root.children)
    state, reward, _, _ = env.step(np.array([1, 1]), np.array([0, 0]))
    assert np.all(reward == 0) and env.curs[0].r == 0
    assert state["hs"].shape == (2, 128) and np.isfinite(state["hs"]).all()
    assert env.model_status()["running"] is False
    env.close()


def test_training_runs_inside_step_after_warm_up_at_the_replay_ratio():
    env = learned()
    env.reset()
    learner = env.model.learner
    info = play(env, 10)  # 20 transitions: still warming up
    assert learner.updates == 0 and info["model_status"]["running"] is False
    info = play(env, 60)
    status = info["model_status"]
    assert status["processed_n"] == 140 and status["running"] is True
    assert learner.updates > 0
    share = SMALL["model_batch_size"] * SMALL["model_unroll_len"] / (140 - 40 + 1)
    # (v1.1, one process: train while below the maximum)
    assert (
        SMALL["model_max_replay_ratio"]
        <= learner.replay_ratio
        < SMALL["model_max_replay_ratio"] + share
    )
    assert set(env.model.losses) == {"rs", "done", "img", "vs", "logits", "total"}
    assert all(np.isfinite(v) for v in env.model.losses.values())
    env.close()


def _first_priorities(**cfg) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One update's new priorities, its windows' summed squared reward errors and their real
    rewards over the unroll until the episode ends (the same seed and no update before it:
    the same batch and model whatever the priority)."""
    env = learned(model_warm_up_n=10_000, **cfg)  # `step` never trains: the test updates
    env.reset()
    play(env, 30)
    learner, seen, k = env.model.learner, {}, SMALL["model_unroll_len"]
    sr_losses, update = learner.sr_losses, learner.replay.update_priorities

    def record_rs(w, x, alive):
        losses, predicted = sr_losses(w, x, alive)
        seen["rs"], seen["rewards"] = losses["rs"].detach().numpy(), w.rewards
        seen["alive"] = alive.numpy()
        return losses, predicted

    def record(leaves, errors):
        seen["errors"] = np.asarray(errors).copy()
        update(leaves, errors)

    learner.sr_losses, learner.replay.update_priorities = record_rs, record
    learner.update()
    env.close()
    return seen["errors"], seen["rs"], seen["rewards"][:, :k] * seen["alive"][:, :k]


def test_reward_errors_raise_a_windows_priority_only_when_asked():
    plain, rs, rewards = _first_priorities()
    boosted, _, _ = _first_priorities(model_reward_priority=10.0)
    # the untrained model predicts reward 0 everywhere: the error is the real rewards' size
    real = np.sqrt((rewards**2).sum(1))
    assert np.ptp(real) > 0  # (windows differ in reward: the test means something)
    np.testing.assert_allclose(np.sqrt(rs), real, atol=1e-5)
    np.testing.assert_allclose(boosted - plain, 10.0 * real, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="model_reward_priority"):
        load_config(model_reward_priority=-1.0)


def test_the_model_learns_the_chains_rewards_and_frames():
    """Trained on random play, the model's imagined steps from the start cell predict the
    rewards and next cells of the real chain."""
    env = learned(
        env_n=4,
        model_buffer_n=2000,
        model_warm_up_n=200,
        model_min_replay_ratio=4.0,
        model_max_replay_ratio=6.0,
        model_lr=3e-3,
    )
    env.reset()
    play(env, 60)
    first = dict(env.model.losses)
    play(env, 160)
    last = env.model.losses
    assert last["rs"] < 0.5 * first["rs"] and last["img"] < 0.5 * first["img"]
    model = env.model
    start = np.eye(CELLS, dtype=np.float32)[[3, 3, 4, 2]]  # cells near the start: often seen
    roots = model.initial(start, np.zeros(4))
    out = model.unroll(roots.states, np.array([0, 1, 1, 0]))  # to cells 2, 4, 5, 1
    np.testing.assert_allclose(out.reward, [0.25, 0.5, 0.0, 0.0], atol=0.15)
    assert out.xs.argmax(1).tolist() == [2, 4, 5, 1]
    assert not out.done.any()
    env.close()


def test_checkpoints_resume_by_experiment_id(tmp_path):
    ids = dict(xpid="run1", savedir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no model checkpoint"):
        learned(ckp=True, **ids)
    env = learned(**ids)
    env.reset()
    play(env, 40)
    learner = env.model.learner
    saved = (learner.processed_n, learner.updates)
    weights = {k: v.clone() for k, v in env.model.sr.state_dict().items()}
    env.close()  # saves savedir/xpid
    assert (tmp_path / "run1" / CHECKPOINT).is_file()
    again = learned(ckp=True, **ids)
    resumed = again.model.learner
    assert (resumed.processed_n, resumed.updates) == saved
    for key, value in again.model.sr.state_dict().items():
        torch.testing.assert_close(value, weights[key])
    # the last entry closes a trajectory: no window runs into the resumed run's episodes
    last = (resumed.replay.t - 1) % resumed.replay.length
    assert resumed.replay.dones[:, last].all() and resumed.replay.truncated[:, last].all()
    again.reset()
    play(again, 5)
    assert again.model.learner.processed_n == saved[0] + 10
    again.close()


def test_the_model_takes_images_and_vectors_only():
    cfg = load_config(wrapper_type=0)
    import gymnasium as gym

    with pytest.raises(ValueError, match="Box observations"):
        ThinkerModel(cfg, gym.spaces.Box(0, 1, (2, 3)), 2)
    with pytest.raises(ValueError, match="Box observations"):
        ThinkerModel(cfg, gym.spaces.Discrete(3), 2)


def test_the_observation_space_holds_what_the_state_holds():
    """hs and xs are in the Dict observation space when returned, so a service serving the
    MDP checks them like any other key."""
    env = make("MistkPuzzle-v0", env_n=2, wrapper_type=0, rec_t=3, train_model=False, return_x=True)
    state = env.reset()
    assert (
        set(env.observation_space.spaces) == set(state) == {"real_states", "tree_reps", "hs", "xs"}
    )
    for _ in range(3):
        for key, space in env.observation_space.spaces.items():
            for row in state[key]:
                assert space.contains(row.astype(space.dtype)), key
        state, *_ = env.step(np.array([0, 1]), np.array([0, 0]))
    env.close()


def test_the_model_bench_measures_held_out_losses(tmp_path):
    """`mistk-rl bench thinker-model`'s run, scaled down: the model trains, its world losses
    on the held-out windows are recorded before and after, and everything stays finite."""
    import json

    from harness.bench.thinker import bench_model

    small = dict(
        rec_t=2,
        model_unroll_len=1,
        model_warm_up_n=24,
        model_batch_size=4,
        model_min_replay_ratio=1.0,
        model_max_replay_ratio=2.0,
        model_buffer_n=200,
        total_steps=48,
    )
    figures = bench_model(
        real_steps=48,
        env_n=8,
        out=str(tmp_path),
        measure_every=5,
        settings=small,
        tree_levels=4,
    )
    assert figures["real_steps"] == 48 and figures["augmented_steps"] == 2 * 48
    assert figures["updates"] > 0 and figures["outputs_finite"]
    first, last = figures["losses"][0], figures["losses"][-1]
    assert first["updates"] == 0 and last["updates"] == figures["updates"]
    assert set(first["held_out"]) == {"rs", "done", "img"}
    assert last["held_out"] != first["held_out"]  # the model the losses measure has changed
    assert json.loads((tmp_path / "model.json").read_text())["updates"] == figures["updates"]
    assert figures["behaviour"] == "shortest-solution solver, epsilon 0.3"
    assert 0 < figures["update_s"] < figures["step_s"] < figures["wall_s"]
    assert len(figures["losses"]) >= 3  # before, every 5 updates, after
    tree = figures["tree"]  # what the trained model's tree is worth to the scripted planner
    assert tree["model_reward"]["levels"] == 4 and tree["planner_levels"] == 4
    assert 0.0 <= tree["planner_on_model"] <= 1.0


def test_the_solver_behaviour_solves_what_random_play_rarely_does():
    """The model bench's behaviour policies: the solver (epsilon 0) ends every level within
    its shortest solution; uniform play in as many steps almost never does."""
    import gymnasium as gym

    from harness.bench.thinker import Behaviour
    from mistk_rl.thinker.puzzle import ENV_ID, MAX_STEPS

    def solved_within(behaviour: Behaviour, steps: int) -> int:
        envs = [gym.make(ENV_ID) for _ in range(32)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        solved = np.zeros(len(envs), dtype=bool)
        for _ in range(steps):
            for i, (env, move) in enumerate(zip(envs, behaviour(envs))):
                if not solved[i]:
                    solved[i] = env.step(int(move))[2]
        return int(solved.sum())

    assert solved_within(Behaviour("solver", epsilon=0.0), MAX_STEPS // 5) == 32
    assert solved_within(Behaviour("random", seed=0), MAX_STEPS // 5) <= 4
    with pytest.raises(ValueError, match="behaviour 'greedy'"):
        Behaviour("greedy")


def _path_return(top, node, gamma: float) -> float:
    """r(top) + g r(..) + ... + g^j r(node) + g^(j+1) v(node), from the nodes' current r, v."""
    path = [node]
    while path[-1] is not top:
        path.append(path[-1].parent)
    total, disc = 0.0, 1.0
    for n in reversed(path):
        total, disc = total + disc * n.r, disc * gamma
    return total + disc * node.v


def _subtree(node):
    yield node
    for child in node.children or ():
        yield from _subtree(child)


def test_every_stored_return_is_the_return_of_the_nodes_as_they_are_now():
    """A learned model re-expands nodes carried over a real step, changing their r and v:
    every list that holds a return through such a node is refreshed (v1.1's override), so
    after each step each node's returns are those recomputed from the current r and v of the
    visited nodes below it, and the tree_reps' root_qs_mean / max read them. (Non-zero heads:
    the model trains from the warm-up on.)"""
    env = learned(env_n=2)
    env.reset()
    gamma, rng = SMALL["discounting"], np.random.default_rng(1)
    refreshed = 0
    for _ in range(400):
        state, _, _, info = env.step(rng.integers(2, size=2), rng.integers(2, size=2))
        for i, root in enumerate(env.roots):
            for node in _subtree(root):
                expected = [_path_return(node, n, gamma) for n in _subtree(node) if n.rollout_n]
                np.testing.assert_allclose(sorted(node.returns), sorted(expected), atol=1e-5)
                refreshed += node.expanded_at > 0 and node.parent is not None and len(expected) > 1
            if info["step_status"][i] != 0:  # (a real step's state carries no tree_reps)
                reps = decode_tree_reps(state["tree_reps"][i : i + 1], 2)
                qs = [
                    [_path_return(c, n, gamma) for n in _subtree(c) if n.rollout_n]
                    for c in root.children
                ]
                np.testing.assert_allclose(
                    reps["root_qs_mean"][0], [np.mean(q) if q else 0.0 for q in qs], atol=1e-5
                )
                np.testing.assert_allclose(
                    reps["root_qs_max"][0], [max(q) if q else 0.0 for q in qs], atol=1e-5
                )
    assert env.model.learner.updates > 0 and abs(env.roots[0].v) > 1e-3  # heads not zero
    assert refreshed > 0
    env.close()
