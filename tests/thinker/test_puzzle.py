"""The puzzle: its pool, its rules and rewards, and clone/restore being exact."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from mistk_rl.thinker.puzzle import (
    BORDER,
    ENV_ID,
    MAX_STEPS,
    MIN_SOLUTION,
    POOL_SIZE,
    SIZE,
    Level,
    PuzzleEnv,
    level_pool,
    solve,
    solver_action,
)

UP, DOWN, LEFT, RIGHT = range(4)


def parse(rows: str) -> Level:
    """A level from text: '#' wall, '@' player, 'B' box, 'T' target (border implied)."""
    lines = rows.split()
    assert len(lines) == SIZE - 2 and all(len(line) == SIZE - 2 for line in lines)
    walls, cells = BORDER, {}
    for r, line in enumerate(lines, start=1):
        for c, ch in enumerate(line, start=1):
            cell = r * SIZE + c
            if ch == "#":
                walls |= 1 << cell
            elif ch != ".":
                cells[ch] = cell
    return Level(walls, cells["T"], cells["B"], cells["@"])


def run(env: PuzzleEnv, actions) -> list[tuple]:
    out = []
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        out.append((obs.tobytes(), reward, terminated, truncated))
    return out


def test_pool_is_deterministic_and_seeded():
    pool = level_pool(0)
    assert len(pool) == POOL_SIZE
    assert level_pool.__wrapped__(0, POOL_SIZE) == pool  # regenerated, not cached
    assert level_pool.__wrapped__(0, 100) == pool[:100]
    assert level_pool.__wrapped__(1, 100) != pool[:100]


def test_every_level_is_solved_by_its_bfs_solution():
    env = PuzzleEnv()
    lengths = []
    for i, level in enumerate(level_pool(0)):
        path = solve(level)
        assert len(path) >= MIN_SOLUTION
        env.reset(options={"level": i})
        rewards = [r for _, r, _, _ in run(env, path)]
        assert env.clone_state().solved
        assert sum(rewards) == pytest.approx(10 + 1 - 0.01 * len(path))
        lengths.append(len(path))
    assert np.median(lengths) == 5


def test_the_solver_moves_along_a_shortest_solution_from_any_state():
    env = PuzzleEnv()
    for i, level in enumerate(level_pool(0)[:50]):
        env.reset(options={"level": i})
        env.step(solve(level)[0] ^ 1)  # a detour first: the solver starts from where it is
        left = len(
            solve(Level(level.walls, level.target, env.clone_state().box, env.clone_state().player))
        )
        for _ in range(left):
            *_, terminated, _, _ = env.step(solver_action(env.clone_state()))
        assert terminated and env.clone_state().solved
        assert solver_action(env.clone_state()) is None  # solved: nothing left to do


def test_the_solver_has_no_move_once_the_box_is_stuck():
    along_the_wall = PuzzleEnv(levels=[parse(".....\n.....\n.....\n..@..\n.TB..")])
    along_the_wall.reset(seed=0)
    assert solver_action(along_the_wall.clone_state()) == RIGHT  # round the box, push left
    cornered = PuzzleEnv(levels=[parse("B....\n.@...\n.....\n.....\n....T")])
    cornered.reset(seed=0)
    assert solver_action(cornered.clone_state()) is None  # a box in a corner never moves


def test_box_on_then_off_the_target():
    env = PuzzleEnv(levels=[parse(".....\n.@BT.\n.....\n.....\n.....")])
    env.reset(seed=0)
    _, reward, terminated, truncated, _ = env.step(RIGHT)
    assert reward == pytest.approx(-0.01 + 1 + 10) and terminated and not truncated
    # Only past the end (or from a restored solved state) can the box leave the target.
    _, reward, terminated, _, _ = env.step(RIGHT)
    assert reward == pytest.approx(-0.01 - 1) and not terminated


def test_walls_stop_the_player_and_the_box():
    env = PuzzleEnv(levels=[parse("@B#..\n.....\n.....\n...T.\n.....")])
    obs0, _ = env.reset(seed=0)
    for action in (UP, LEFT, RIGHT):  # border, border, box against an inner wall
        obs, reward, terminated, truncated, _ = env.step(action)
        assert np.array_equal(obs, obs0) and reward == pytest.approx(-0.01)
        assert not terminated and not truncated


def test_the_cap_truncates_at_50_steps():
    env = PuzzleEnv(levels=[parse("@....\n..B..\n.....\n...T.\n.....")])
    env.reset(seed=0)
    flags = [(te, tr) for _, _, te, tr in run(env, [UP] * MAX_STEPS)]
    assert flags == [(False, False)] * (MAX_STEPS - 1) + [(False, True)]


def test_observation_planes():
    env = PuzzleEnv()
    obs, info = env.reset(seed=3)
    assert obs.shape == (4, SIZE, SIZE) and obs.dtype == np.uint8
    assert env.observation_space.contains(obs)
    assert obs[0].sum() == 4 * (SIZE - 1) + 2  # border + 2 inner walls
    assert [int(p.sum()) for p in obs[1:]] == [1, 1, 1]
    level = env.levels[info["level"]]
    for plane, cell in zip(obs[1:], (level.target, level.box, level.player)):
        assert plane.reshape(-1)[cell] == 1
    assert obs[0].reshape(-1)[[level.target, level.box, level.player]].sum() == 0


def test_reset_picks_levels_by_seed_or_option():
    env = PuzzleEnv()
    assert env.reset(seed=7)[1] == env.reset(seed=7)[1]
    assert env.reset(options={"level": 42})[1] == {"level": 42}


def test_in_order_plays_its_levels_one_after_another_then_again():
    levels = level_pool(0, 5)[2:5]
    env = PuzzleEnv(levels=levels, in_order=True)
    played = [env.reset(seed=s)[1]["level"] for s in range(7)]  # the seed does not choose
    assert played == [0, 1, 2, 0, 1, 2, 0]
    assert env.reset(options={"level": 2})[1] == {"level": 2}  # an explicit level still wins


def test_restore_replays_exactly():
    rng = np.random.default_rng(0)
    env, other = PuzzleEnv(), PuzzleEnv()
    env.reset(seed=0)
    for _ in range(200):
        env.reset()
        run(env, rng.integers(4, size=rng.integers(0, 10)))
        snapshot = env.clone_state()
        hash(snapshot)
        rng_state = env.np_random.bit_generator.state
        actions = rng.integers(4, size=30)
        first = run(env, actions)
        assert env.np_random.bit_generator.state == rng_state  # step draws no randomness
        env.restore_state(snapshot)
        assert run(env, actions) == first
        other.restore_state(snapshot)  # a fresh instance too
        assert run(other, actions) == first


def test_registered_without_time_limit():
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    assert env.spec.max_episode_steps is None
    assert env.unwrapped.clone_state().steps == 0
    import mistk_rl.thinker.puzzle  # noqa: F401  re-import does not re-register
