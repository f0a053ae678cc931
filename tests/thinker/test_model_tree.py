"""`harness.bench.model_tree`: a learned model's reward predictions along real paths, measured
against models whose answers are known: one that reads the true puzzle, one that always says
"solved" and one that never does."""

from __future__ import annotations

import numpy as np

from harness.bench.model_tree import reward_accuracy
from mistk_rl.thinker import puzzle


class _Out:
    def __init__(self, states: list, reward: np.ndarray) -> None:
        self.states, self.reward = states, reward


class _OracleModel:
    """Predicts the true reward: its node state is the true puzzle state, read off the frame
    (planes: walls, target, box, player) and stepped with the real env."""

    def initial(self, frames: np.ndarray, prev_actions: np.ndarray) -> _Out:
        planes = frames[0].reshape(4, -1)
        walls = sum(1 << int(c) for c in np.flatnonzero(planes[0]))
        target, box, player = (int(np.flatnonzero(planes[i])[0]) for i in (1, 2, 3))
        return _Out([puzzle.PuzzleState(walls, target, player, box, 0)], np.zeros(1))

    def unroll(self, states: list, actions: np.ndarray) -> _Out:
        env = puzzle.PuzzleEnv()
        env.reset(seed=0)
        env.restore_state(states[0])
        _, reward, *_ = env.step(int(actions[0]))
        return _Out([env.clone_state()], np.array([reward], dtype=np.float32))


class _ConstantModel(_OracleModel):
    def __init__(self, reward: float) -> None:
        self.constant = reward

    def unroll(self, states: list, actions: np.ndarray) -> _Out:
        return _Out(states, np.array([self.constant], dtype=np.float32))


LEVELS = puzzle.level_pool(0, 40)


def test_a_model_that_reads_the_true_puzzle_finds_every_solve_and_no_false_one():
    row = reward_accuracy(_OracleModel(), LEVELS, depth=5, random_paths=4, seed=0)
    assert row["levels"] == 40
    # every level within 5 moves has its solving move; random walks find a few more
    within = sum(len(puzzle.solve(level)) <= 5 for level in LEVELS)
    assert within > 0 and row["solving_moves"] >= within
    assert row["recall"] == 1.0 and row["false_alarm_rate"] == 0.0
    assert row["mean_predicted_solving"] > puzzle.SOLVED
    assert row["other_moves"] > 4 * 40  # (walks end early only when they solve)


def test_a_model_that_always_says_solved_raises_an_alarm_on_every_other_move():
    row = reward_accuracy(_ConstantModel(11.0), LEVELS, seed=0)
    assert row["recall"] == 1.0 and row["false_alarm_rate"] == 1.0


def test_a_model_that_never_says_solved_misses_every_solve():
    row = reward_accuracy(_ConstantModel(-0.1), LEVELS, seed=0)
    assert row["recall"] == 0.0 and row["false_alarm_rate"] == 0.0
    assert abs(row["mean_predicted_other"] + 0.1) < 1e-6
