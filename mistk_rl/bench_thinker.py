"""`mistk-rl bench thinker-planner`: the scripted planner (random imagination, then the root
child with the best return found) on the puzzle with the perfect model and an untrained (zero)
value function, in-process: the share of episodes solved, over random levels of the pool, per
(K, L). What it solves is the signal the tree statistics carry, with no learning at all.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from mistk_rl.thinker import make
from mistk_rl.thinker.planner import plan
from mistk_rl.thinker.puzzle import ENV_ID


def planner_solve_rate(rec_t: int = 10, max_depth: int = 5, episodes: int = 3000,
                       env_n: int = 16, seed: int = 0) -> dict[str, Any]:
    """Play the scripted planner until `episodes` episodes ended; a solved episode is one
    whose return includes the +10 for the box on the target."""
    env = make(ENV_ID, env_n=env_n, wrapper_type=2, rec_t=rec_t, max_depth=max_depth,
               train_model=False, model_zero_init=True, seed=seed)
    rng = np.random.default_rng(seed)
    state = env.reset()
    solved = ended = steps = 0
    start = time.perf_counter()
    try:
        while ended < episodes:
            primary, reset = plan(state["tree_reps"], env.num_actions, rng)
            state, _, done, info = env.step(primary, reset)
            steps += env_n
            for i in np.flatnonzero(done):
                ended += 1
                solved += bool(info["episode_return"][i] > 5.0)
    finally:
        env.close()
    wall = time.perf_counter() - start
    return {"rec_t": rec_t, "max_depth": max_depth, "seed": seed, "episodes": ended,
            "solved": solved, "solve_rate": solved / ended, "augmented_steps": steps,
            "augmented_steps_per_s": steps / wall, "wall_s": wall}


def bench_planner(settings: Sequence[tuple[int, int]] = ((10, 5), (20, 5)),
                  episodes: int = 3000, seed: int = 0) -> list[dict[str, Any]]:
    rows = []
    for rec_t, max_depth in settings:
        row = planner_solve_rate(rec_t, max_depth, episodes, seed=seed)
        print(f"K={rec_t:>3} L={max_depth}: solved {row['solved']}/{row['episodes']} "
              f"= {row['solve_rate']:.3f} (seed {seed}; {row['augmented_steps_per_s']:.0f} "
              f"augmented steps/s)", flush=True)
        rows.append(row)
    return rows

