"""The Thinker-augmented MDP's stage rules and tree statistics, against hand-computed values
on a 7-cell chain with a table value function (tests/thinker/chain.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mistk_rl.thinker import decode_tree_reps, load_config, make
from mistk_rl.thinker.tree import Layout
from tests.thinker.chain import LOGITS, REWARDS, START, VALUES, Chain, table_vp

GAMMA = 0.5


def chain(env_n: int = 1, **cfg):
    settings = dict(wrapper_type=2, rec_t=4, max_depth=5, discounting=GAMMA, vp_fn=table_vp)
    settings.update(cfg)
    return make(env_fn=Chain, env_n=env_n, **settings)


def fields(state, name, i=0):
    return decode_tree_reps(state["tree_reps"], 2)[name][i]


@pytest.mark.parametrize("num_actions, rec_t", [(2, 1), (4, 10), (5, 20), (9, 3)])
def test_tree_reps_length_is_9_plus_10a_plus_k(num_actions, rec_t):
    layout = Layout(num_actions, rec_t)
    assert layout.length == 9 + 10 * num_actions + rec_t
    slices = layout.slices
    covered = sorted(i for s in slices.values() for i in range(s.start, s.stop))
    assert covered == list(range(layout.length))  # every position named exactly once
    decoded = decode_tree_reps(np.zeros((3, layout.length)), num_actions)
    assert decoded["reset"].shape == (3,) and decoded["root_v"].shape == (3, 1)
    assert decoded["time"].shape == (3, rec_t) and decoded["root_qs_max"].shape == (3, num_actions)


def test_the_env_state_has_the_seeds_shapes():
    env = chain(env_n=3, rec_t=10)
    state = env.reset()
    assert state["tree_reps"].shape == (3, 9 + 10 * 2 + 10)
    assert state["real_states"].shape == (3, 7)
    assert set(env.observation_space.spaces) == {"tree_reps", "real_states"}
    assert env.observation_space.contains({k: v[0] for k, v in state.items()})


@pytest.mark.parametrize("rec_t", [1, 2, 3, 5])
def test_step_status_cycles_through_a_stage(rec_t):
    env = chain(rec_t=rec_t, max_depth=0)
    env.reset()
    statuses = [int(env.step([1], [1])[3]["step_status"][0]) for _ in range(3 * rec_t)]
    stage = [0] if rec_t == 1 else [1] * (rec_t - 2) + [2, 0]
    assert statuses == stage * 3


def test_the_real_env_moves_on_real_steps_only():
    """real_states changes at the real step and holds through the stage; the root's state
    counts real steps only, so imagination does not eat into the episode's step cap."""
    env = chain(rec_t=4, tree_carry=False)
    state = env.reset()
    cells = [int(state["real_states"][0].argmax())]
    for action in [1, 1, 0, 1, 0, 0, 1, 0]:  # (imaginary actions wander; real: 1 then 0)
        state, reward, done, info = env.step([action], [0])
        cells.append(int(state["real_states"][0].argmax()))
        if info["step_status"][0] == 0:
            assert env.roots[0].state == (cells[-1], env.real_steps)  # (cell, episode steps)
    # stage 1: imaginary 1, 1, 0; real 1 -> cell 4; stage 2: imaginary 0, 0, 1; real 0 -> 3
    assert cells == [3, 3, 3, 3, 4, 4, 4, 4, 3]


def test_statistics_by_hand_on_the_chain():
    """Walk right three times from cell 3, then take the real step right."""
    env = chain(rec_t=4, max_depth=5)
    s0 = env.reset()
    # the root: cell 3, v = .3; its list [g v] gives Gmax = G(root) = v(root)
    assert fields(s0, "root_v")[0] == pytest.approx(VALUES[3])
    assert fields(s0, "root_max_v")[0] == pytest.approx(VALUES[3])
    assert fields(s0, "root_trail_q")[0] == pytest.approx(VALUES[3])
    np.testing.assert_allclose(fields(s0, "root_logits"), LOGITS[START])
    assert fields(s0, "reset") == 1 and fields(s0, "derec")[0] == 1.0

    g = GAMMA
    s1, _, _, i1 = env.step([1], [0])  # into cell 4: r .5, v .4
    q1 = REWARDS[4] + g * VALUES[4]  # .7: Q of action 1 from the root, = G(cell 4)
    np.testing.assert_allclose(fields(s1, "root_qs_mean"), [0, q1], rtol=1e-6)
    np.testing.assert_allclose(fields(s1, "root_qs_max"), [0, q1], rtol=1e-6)
    np.testing.assert_allclose(fields(s1, "root_ns"), [0, 1 / 4])
    assert fields(s1, "root_trail_r")[0] == pytest.approx(REWARDS[4])
    assert fields(s1, "root_trail_q")[0] == pytest.approx(q1)
    assert fields(s1, "root_max_v")[0] == pytest.approx(q1)
    assert i1["im_reward"][0] == pytest.approx(q1 - VALUES[3])
    assert fields(s1, "cur_r")[0] == pytest.approx(REWARDS[4])
    assert fields(s1, "cur_v")[0] == pytest.approx(VALUES[4])
    assert fields(s1, "derec")[0] == pytest.approx(g)

    s2, _, _, i2 = env.step([1], [0])  # into cell 5: r 0, v .6
    g2 = REWARDS[4] + g * REWARDS[5] + g * g * VALUES[5]  # .65 < .7
    q_cell4_own, q_cell4_child = REWARDS[4] + g * VALUES[4], g2
    np.testing.assert_allclose(
        fields(s2, "root_qs_mean"), [0, (q_cell4_own + q_cell4_child) / 2], rtol=1e-6
    )
    np.testing.assert_allclose(fields(s2, "root_qs_max"), [0, q1], rtol=1e-6)
    np.testing.assert_allclose(fields(s2, "root_ns"), [0, 2 / 4])
    assert fields(s2, "root_trail_q")[0] == pytest.approx(g2)
    assert fields(s2, "root_trail_r")[0] == pytest.approx(REWARDS[4] + g * REWARDS[5])
    assert i2["im_reward"][0] == 0.0  # Gmax did not rise
    # the current node's own stats: cell 5's children, of which none is visited
    np.testing.assert_allclose(fields(s2, "cur_ns"), [0, 0])
    np.testing.assert_allclose(fields(s2, "cur_logits"), LOGITS[5])

    s3, _, _, i3 = env.step([1], [0])  # into cell 6: r 2, terminal, v 0
    g3 = REWARDS[4] + g * REWARDS[5] + g * g * REWARDS[6]  # 1.0
    assert fields(s3, "root_max_v")[0] == pytest.approx(g3)
    assert i3["im_reward"][0] == pytest.approx(g3 - q1)
    assert fields(s3, "cur_v")[0] == 0.0  # terminal

    s4, reward, done, i4 = env.step([1], [0])  # the real step, right: r .5, no end
    assert reward[0] == REWARDS[4] and not done[0] and i4["im_reward"][0] == 0.0
    assert i4["baseline"][0] == pytest.approx(np.mean([VALUES[3], q1, g2, g3]))
    assert i4["max_rollout_depth"][0] == 3
    assert i4["im_episode_return"][0] == pytest.approx(g3 - VALUES[3])  # the stage's total
    # the carried root is cell 4; its list seen from itself: g v(4), then g (G - r(4))
    assert fields(s4, "root_v")[0] == pytest.approx(VALUES[4])
    assert fields(s4, "root_r")[0] == 0.0
    assert fields(s4, "root_max_v")[0] == pytest.approx((g3 - REWARDS[4]) / g)
    np.testing.assert_allclose(fields(s4, "root_ns"), [0, 2 / 4])  # cells 5 and 6 carried
    np.testing.assert_allclose(fields(s4, "root_action"), [0, 1])


def _reference_stats(
    path_visits: list[tuple[int, ...]], gamma: float, rec_t: int, root_cell: int
) -> dict:
    """The root's statistics from first principles: G of every distinct visited node, from
    the chain's own reward and value tables, with no tree code."""

    def walk(path):
        cell, g, disc, done = root_cell, 0.0, 1.0, False
        for a in path:
            if done:
                continue  # past a terminal: r 0, v 0
            cell += 1 if a == 1 else -1
            g += disc * REWARDS[cell]
            disc *= gamma
            done = cell in (0, 6)
        return g + (0.0 if done else disc * VALUES[cell])

    visited = list(dict.fromkeys(path_visits))  # distinct, in first-visit order
    returns = {p: walk(p) for p in visited}
    out = {"gmax": max(returns.values()), "baseline": np.mean(list(returns.values()))}
    for a in (0, 1):
        below = [p for p in visited if p[:1] == (a,)]
        # a child's list: returns seen from the root, which are the G of its subtree's nodes
        out[f"qs_mean_{a}"] = np.mean([returns[p] for p in below]) if below else 0.0
        out[f"qs_max_{a}"] = max(returns[p] for p in below) if below else 0.0
        out[f"ns_{a}"] = len(below) / rec_t
    return out


@pytest.mark.parametrize("seed", range(6))
def test_root_statistics_agree_with_a_reference_over_random_stages(seed):
    rng = np.random.default_rng(seed)
    rec_t, depth_cap = 8, 3
    env = chain(rec_t=rec_t, max_depth=depth_cap, tree_carry=False)
    state = env.reset()
    for _stage in range(4):
        root_cell = int(state["real_states"][0].argmax())
        path: tuple[int, ...] = ()
        visits = [()]
        for _ in range(rec_t - 1):
            a, reset = int(rng.integers(2)), int(rng.random() < 0.3)
            state, _, _, info = env.step([a], [reset])
            path += (a,)
            visits.append(path)
            ref = _reference_stats(visits, GAMMA, rec_t, root_cell)
            assert fields(state, "root_max_v")[0] == pytest.approx(ref["gmax"], abs=1e-6)
            for b in (0, 1):
                assert fields(state, "root_qs_mean")[b] == pytest.approx(
                    ref[f"qs_mean_{b}"], abs=1e-6
                )
                assert fields(state, "root_qs_max")[b] == pytest.approx(
                    ref[f"qs_max_{b}"], abs=1e-6
                )
                assert fields(state, "root_ns")[b] == pytest.approx(ref[f"ns_{b}"])
            if reset or len(path) >= depth_cap:
                path = ()
        state, _, _, info = env.step([int(rng.integers(2))], [0])
        assert info["baseline"][0] == pytest.approx(ref["baseline"], abs=1e-6)
        assert fields(state, "root_ns").sum() == 0  # no carry: a fresh root


def test_planning_reward_is_the_rise_of_gmax_over_a_stage():
    rng = np.random.default_rng(0)
    env = chain(env_n=4, rec_t=6, max_depth=3)
    state = env.reset()
    start = decode_tree_reps(state["tree_reps"], 2)["root_max_v"][:, 0].copy()
    total = np.zeros(4)
    for _ in range(60):
        state, _, _, info = env.step(rng.integers(2, size=4), rng.integers(2, size=4))
        assert (info["im_reward"] >= 0).all()
        total += info["im_reward"]
        if info["step_status"][0] == 2:  # the stage's last imaginary step
            end = decode_tree_reps(state["tree_reps"], 2)["root_max_v"][:, 0]
            np.testing.assert_allclose(total, end - start, atol=1e-6)
        if info["step_status"][0] == 0:
            assert (info["im_reward"] == 0).all()
            total[:] = 0
            start = decode_tree_reps(state["tree_reps"], 2)["root_max_v"][:, 0].copy()


def test_the_reset_is_forced_at_depth_l():
    env = chain(rec_t=8, max_depth=2)
    env.reset()
    resets, depths = [], []
    for _ in range(6):
        state, _, _, _ = env.step([1], [0])
        resets.append(int(fields(state, "reset")))
        depths.append(round(float(np.log(fields(state, "derec")[0]) / np.log(GAMMA))))
    assert depths == [1, 2, 1, 2, 1, 2]  # after each forced reset the walk starts at the root
    assert resets == [0, 1, 0, 1, 0, 1]


def test_a_chosen_reset_returns_to_the_root():
    env = chain(rec_t=8, max_depth=0)
    env.reset()
    env.step([1], [1])
    state, _, _, _ = env.step([0], [0])  # from the root again: into cell 2
    assert fields(state, "cur_r")[0] == REWARDS[2]


def test_imagined_rewards_replay_on_a_copy_of_the_env():
    rng = np.random.default_rng(1)
    env = chain(env_n=2, rec_t=7, max_depth=4)
    env.reset()
    paths: list[list[int]] = [[], []]
    root_states = [r.state for r in env.roots]
    for _ in range(70):
        actions, resets = rng.integers(2, size=2), rng.integers(2, size=2) * (rng.random() < 0.2)
        state, _, _, info = env.step(actions, resets)
        if info["step_status"][0] == 0:
            paths = [[], []]
            root_states = [r.state for r in env.roots]
            continue
        for i in range(2):
            paths[i].append(int(actions[i]))
            copy = Chain()
            copy.restore_state(root_states[i])
            reward, ended = 0.0, False
            for a in paths[i]:
                reward = 0.0 if ended else copy.step(a)[1]
                ended = ended or copy.pos in (0, 6)
            assert fields(state, "cur_r", i)[0] == pytest.approx(reward)
            if fields(state, "reset", i) == 1:
                paths[i] = []


def test_terminal_nodes_stay_terminal_and_never_step_the_env():
    env = chain(rec_t=10, max_depth=0)
    env.reset()
    for _ in range(3):
        env.step([1], [0])  # cells 4, 5, then 6: terminal
    steps_before = env.envs[0].real_steps
    for _ in range(4):  # beyond the end
        state, _, _, info = env.step([0], [0])
        assert fields(state, "cur_r")[0] == 0.0 and fields(state, "cur_v")[0] == 0.0
        assert info["im_reward"][0] == 0.0
    assert env.envs[0].real_steps == steps_before


def test_a_real_step_into_a_terminal_resets_the_episode():
    env = chain(rec_t=1)  # every step real
    env.reset()
    rewards, dones, cells = [], [], []
    for _ in range(3):
        state, reward, done, info = env.step([1], [0])
        rewards.append(float(reward[0]))
        dones.append(bool(done[0]))
        cells.append(int(state["real_states"][0].argmax()))
    assert rewards == [REWARDS[4], REWARDS[5], REWARDS[6]] and dones == [False, False, True]
    assert cells == [4, 5, START]  # the new episode's frame
    assert info["episode_return"][0] == pytest.approx(REWARDS[4] + REWARDS[5] + REWARDS[6])
    np.testing.assert_allclose(fields(state, "root_action"), [1, 0])  # action 0 after an end


def test_tree_carry_keeps_the_chosen_subtree():
    for carry, expected in ((True, [0, 2 / 4]), (False, [0, 0])):
        env = chain(rec_t=4, tree_carry=carry, max_depth=5)
        env.reset()
        for a in (1, 1, 1):
            env.step([a], [0])
        state, _, _, _ = env.step([1], [0])
        np.testing.assert_allclose(fields(state, "root_ns"), expected)


def test_episode_counters():
    env = chain(rec_t=3, max_depth=0)
    env.reset()
    steps, returns = [], []
    for _ in range(9):
        _, _, done, info = env.step([1], [0])
        steps.append(int(info["episode_step"][0]))
        returns.append(float(info["episode_return"][0]))
        if info["step_status"][0] == 0:
            stage_im = info["im_episode_return"][0]
            assert stage_im >= 0
    # the real steps take cells 4, 5, 6 (the end): 9 augmented steps in the episode
    assert steps == list(range(1, 10)) and done[0]
    assert returns[-1] == pytest.approx(REWARDS[4] + REWARDS[5] + REWARDS[6])
    _, _, _, info = env.step([1], [0])
    assert info["episode_step"][0] == 1 and info["episode_return"][0] == 0.0


def test_reward_clip_clips_the_reward_but_not_the_return():
    env = chain(rec_t=1, reward_clip=0.3)
    env.reset()
    rewards = [float(env.step([1], [0])[1][0]) for _ in range(3)]
    assert rewards == pytest.approx([0.3, 0.0, 0.3])


def test_the_raw_wrapper_is_the_env():
    env = make(env_fn=Chain, wrapper_type=1, rec_t=10)
    state = env.reset()
    assert set(state) == {"real_states"}
    _, reward, _, info = env.step([1], [1])
    assert info["step_status"][0] == 0 and reward[0] == REWARDS[4]
    assert info["model_status"] == {
        "processed_n": 0,
        "warm_up_n": 0,
        "running": False,
        "finish": True,
    }


def test_stat_mask_type_hides_the_search():
    env = chain(stat_mask_type=1)
    env.reset()
    state, _, _, _ = env.step([1], [0])
    for name in ("root_qs_mean", "root_qs_max", "root_ns", "root_max_v", "cur_qs_max"):
        assert not fields(state, name).any()
    assert fields(state, "root_v")[0] == pytest.approx(VALUES[3])  # type 1 keeps v


def test_settings_unknown_keys_and_precedence(tmp_path):
    with pytest.raises(ValueError, match="rec_tt"):
        load_config(rec_tt=4)
    path = tmp_path / "custom.yaml"
    path.write_text("rec_t: 10\nmax_depth: 10\n")
    cfg = load_config(path, max_depth=3)
    assert (cfg.rec_t, cfg.max_depth) == (10, 3)  # keywords win over the file
    with pytest.raises(ValueError, match="wrapper_type"):
        load_config(wrapper_type=3)
    with pytest.raises(ValueError, match="CPU"):
        make(env_fn=Chain, gpu=True)


def test_bad_actions_are_refused():
    env = chain(env_n=2)
    env.reset()
    for primary, reset in (([0], [0, 0]), ([0, 2], [0, 0]), ([0, 1], [0, 2]), ([0.5, 1], None)):
        with pytest.raises(ValueError):
            env.step(primary, reset)


def test_lock_step_envs_are_independent():
    """Two envs given different actions see the trees of their own actions."""
    env = chain(env_n=2, rec_t=3)
    env.reset()
    for a in itertools.islice(itertools.cycle([(1, 0)]), 3):
        state, reward, _, _ = env.step(list(a), [0, 0])
    assert reward.tolist() == [REWARDS[4], REWARDS[2]]
    assert state["real_states"].argmax(1).tolist() == [4, 2]


def test_cartpole_with_the_perfect_model():
    """1-D observations (an extension of v1.1, which takes images only) and an env made
    cloneable by the project's wrapper: imagination never moves the real pole."""
    env = make(
        "CartPole-v1",
        env_n=2,
        wrapper_type=2,
        rec_t=5,
        max_depth=3,
        seed=0,
        vp_fn=lambda obs: (np.zeros(len(obs)), np.zeros((len(obs), 2))),
    )
    state = env.reset()
    assert state["real_states"].shape == (2, 4)
    frames = state["real_states"].copy()
    for _ in range(4):
        state, reward, _, _ = env.step([0, 1], [0, 0])
        np.testing.assert_array_equal(state["real_states"], frames)
        assert not reward.any()
    state, reward, _, _ = env.step([1, 1], [0, 0])
    assert (reward == 1.0).all() and not np.array_equal(state["real_states"], frames)
    qs = decode_tree_reps(state["tree_reps"], 2)["root_qs_max"]
    assert qs.shape == (2, 2)
