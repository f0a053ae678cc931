"""A scripted planner for the Thinker MDP: imagine at random, then act on what the tree found.

It learns nothing, so what it solves measures whether the tree statistics carry the signal:
during a stage it walks the tree with random primary actions (the forced reset at depth L
brings it back to the root); at the real step it takes the root child with the best
``root_qs_max``, the best return found below that action. Children never visited have no
return yet; they are chosen only when no child was visited.
"""

from __future__ import annotations

import numpy as np

from mistk_rl.thinker.tree import decode_tree_reps


def plan(
    tree_reps: np.ndarray, num_actions: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(primary, reset) for a batch of tree_reps [n, N]: random while imagining, the best
    visited root child when the next step is real. Never resets by choice."""
    fields = decode_tree_reps(np.asarray(tree_reps, dtype=np.float32), num_actions)
    n = len(tree_reps)
    primary = rng.integers(num_actions, size=n)
    next_is_real = fields["time"][:, -1] == 1  # the stage's step counter is at K - 1
    for i in np.flatnonzero(next_is_real):
        visited = fields["root_ns"][i] > 0
        if visited.any():
            qs = np.where(visited, fields["root_qs_max"][i], -np.inf)
            best = np.flatnonzero(qs == qs.max())
            primary[i] = rng.choice(best)
    return primary, np.zeros(n, dtype=np.int64)
