"""Is a learned Thinker model's tree worth reading? Its reward predictions along real paths.

A tree built by the learned model (wrapper_type 0) informs only as far as the model predicts
what the real puzzle does. The world losses (`bench thinker-model`) are averages dominated by
the common steps; what the tree's returns hang on is the rare solving reward. So this walks
real levels with the true env and the model side by side, from each level's start:

- along the level's shortest solution (when it is at most `depth` moves), whose last move
  earns the solving reward: *recall* is the share of those moves the model predicts above
  half of it;
- along `random_paths` random walks of `depth` moves: a *false alarm* is a move the model
  predicts above half of the solving reward where the true reward is not (the tree then
  reports a solution that is not there).

A model that misses solves leaves the tree without its signal; one with false alarms (about 9
imaginary steps a stage) makes the tree point the wrong way, worse than no tree.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mistk_rl.thinker import puzzle

SOLVED_HALF = puzzle.SOLVED / 2  # a predicted reward above this says "solved"


def reward_accuracy(
    model: Any,
    levels: Sequence[puzzle.Level],
    depth: int = 5,
    random_paths: int = 4,
    seed: int = 1,
) -> dict[str, Any]:
    """`model`: a `ThinkerModel` with its SR-net (initial/unroll). Recall of the solving
    reward along shortest solutions, false alarms along random walks, and the mean predicted
    reward of each kind of move (module doc)."""
    rng = np.random.default_rng(seed)
    solving: list[float] = []
    other: list[float] = []
    for level in levels:
        solution = puzzle.solve(level)
        paths = [solution[:depth]] if len(solution) <= depth else []
        paths += [list(rng.integers(len(puzzle.ACTIONS), size=depth)) for _ in range(random_paths)]
        for path in paths:
            for true, predicted in _walk(model, level, path):
                (solving if true > SOLVED_HALF else other).append(predicted)
    hits, alarms = np.asarray(solving) > SOLVED_HALF, np.asarray(other) > SOLVED_HALF
    return {
        "levels": len(levels),
        "solving_moves": len(solving),
        "recall": float(hits.mean()) if solving else float("nan"),
        "mean_predicted_solving": float(np.mean(solving)) if solving else float("nan"),
        "other_moves": len(other),
        "false_alarm_rate": float(alarms.mean()),
        "mean_predicted_other": float(np.mean(other)),
    }


def _walk(model: Any, level: puzzle.Level, actions: Sequence[int]) -> list[tuple[float, float]]:
    """(true reward, predicted reward) of each move of `actions` from `level`'s start, up to
    the episode's end."""
    env = puzzle.PuzzleEnv(levels=(level,), in_order=True)
    obs, _ = env.reset()
    states = model.initial(obs[None], np.zeros(1, dtype=np.int64)).states
    pairs = []
    for action in actions:
        out = model.unroll(states, np.array([action]))
        states = out.states
        _, reward, terminated, truncated, _ = env.step(int(action))
        pairs.append((float(reward), float(out.reward[0])))
        if terminated or truncated:
            break
    return pairs


def say_reward_accuracy(row: dict[str, Any]) -> str:
    return (
        f"reward along real paths ({row['levels']} levels): solving moves {row['solving_moves']}, "
        f"recall {row['recall']:.3f} (mean predicted {row['mean_predicted_solving']:.2f}); "
        f"other moves {row['other_moves']}, false alarms {row['false_alarm_rate']:.3f} "
        f"(mean predicted {row['mean_predicted_other']:.3f})"
    )
