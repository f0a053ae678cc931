"""The search tree of one env and its statistics, as the Thinker-augmented MDP (v1.1) keeps them.

Every node holds a list of rollout returns: on a node's first visit, each node on the path
from the root to it appends the return of the path seen from its own parent,
``r(m) + g r(m+1) + ... + g^j v(visited)``. So a child's list holds Q-values from its parent
(``qs_mean``, ``qs_max``), the root's list holds ``g * G`` of every visited node, and
``rollout_n`` counts the distinct visited nodes of a subtree (``ns`` = rollout_n / K).
``G(n) = sum_i g^(i-1) r_i + g^d v(n)`` along the path root -> n; ``Gmax`` is the best G seen.
Each list entry remembers the node it is the return of (`Node.visits`), so that when a
learned model re-expands a node (new r and v) the lists through it are recomputed
(`refresh`, v1.1's override): a list always holds the returns of the nodes as they are now.

The tree knows nothing of envs or models: `Node.state` is whatever the expander keeps (an env
snapshot for the perfect model, a hidden state for a learned one).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Optional

import numpy as np


class Node:
    """A node: the reward and value of reaching it, its children's prior logits once
    expanded, and its rollout statistics."""

    __slots__ = (
        "action",
        "parent",
        "logit",
        "r",
        "v",
        "done",
        "state",
        "frame",
        "hidden",
        "children",
        "expanded_at",
        "returns",
        "visits",
        "rollout_n",
        "trail_r",
        "trail_disc",
        "rollout_q",
    )

    def __init__(self, action: int, parent: Optional[Node], logit: float) -> None:
        self.action = action  # the action that leads here from the parent
        self.parent = parent
        self.logit = logit  # the parent's prior logit for this action
        self.r = 0.0  # reward of the step into this node
        self.v = 0.0  # value estimate of this node (0 when terminal)
        self.done = False  # the step into this node ended the episode
        self.state: Any = None  # the expander's state (env snapshot, model state)
        self.frame: Any = None  # the observation here (perfect model) or predicted (learned)
        self.hidden: Any = None  # the model's hidden state here, for state["hs"]
        self.children: Optional[list[Node]] = None  # all A created at expansion
        self.expanded_at = -1  # the real step it was (re-)expanded at (learned models)
        self.returns: list[float] = []  # rollout returns appended on first visits below
        self.visits: list[Node] = []  # the node each entry of `returns` is the return of
        self.rollout_n = 0
        self.trail_r = 0.0
        self.trail_disc = 1.0
        self.rollout_q = 0.0

    @property
    def expanded(self) -> bool:
        return self.children is not None

    def expanded_children(self) -> list[Node]:
        """The children of an expanded node (a root, or a node the walk stands on)."""
        if self.children is None:
            raise RuntimeError(f"the node reached by action {self.action} is not expanded")
        return self.children

    def expand(
        self,
        r: float,
        v: float,
        logits: np.ndarray,
        done: bool,
        state: Any,
        frame: Any = None,
        hidden: Any = None,
        step: int = -1,
    ) -> None:
        """Set what reaching this node gave, and create its children with their priors."""
        self.r, self.v, self.done = float(r), (0.0 if done else float(v)), bool(done)
        self.state, self.frame, self.hidden, self.expanded_at = state, frame, hidden, step
        if self.children is None:
            self.children = [Node(a, self, float(logit)) for a, logit in enumerate(logits)]
        else:  # a learned model re-expanding a carried node: keep the subtree, new priors
            for child, logit in zip(self.children, logits):
                child.logit = float(logit)

    def path(self) -> list[Node]:
        """This node and its ancestors, from here up to the root."""
        node: Optional[Node] = self
        nodes = []
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes


def visit(node: Node, gamma: float) -> None:
    """Arrive at `node`: restart its trail and pass its reward and value up the path.

    Each ancestor m's trail is the discounted reward sum from m's own reward down to here, so
    ``m.rollout_q = r(m) + ... + g^j r(node) + g^(j+1) v(node)``; a first visit appends that
    to m's list and counts the node in m's subtree."""
    first = node.rollout_n == 0
    node.trail_r, node.trail_disc = 0.0, 1.0
    for m in node.path():
        m.trail_r += m.trail_disc * node.r
        m.trail_disc *= gamma
        m.rollout_q = m.trail_r + m.trail_disc * node.v
        if first:
            m.returns.append(m.rollout_q)
            m.visits.append(node)
            m.rollout_n += 1


def path_return(top: Node, node: Node, gamma: float) -> float:
    """The return of the path from `top` down to `node`, seen from top's parent:
    ``r(top) + g r(..) + ... + g^j r(node) + g^(j+1) v(node)`` (an entry of top's list)."""
    path = [node]
    while path[-1] is not top:
        parent = path[-1].parent
        if parent is None:
            raise ValueError("path_return: top is not an ancestor of node")
        path.append(parent)
    total, disc = 0.0, 1.0
    for n in reversed(path):
        total += disc * n.r
        disc *= gamma
    return total + disc * node.v


def refresh(node: Node, gamma: float) -> None:
    """Recompute the lists that hold a return through `node` (its own and its ancestors'),
    after its r or v changed: a learned model re-expanded it."""
    for m in node.path():
        m.returns = [path_return(m, n, gamma) for n in m.visits]


def new_root(
    node: Node,
    v: float,
    logits: np.ndarray,
    state: Any,
    gamma: float,
    frame: Any = None,
    hidden: Any = None,
    step: int = -1,
) -> Node:
    """`node` (a child of the old root, with its subtree) as the root after a real step.

    Its list entries were returns seen from the old root, ``r + g G'`` with G' the return from
    `node`; with r now 0 (as every root's) they are ``g G'``, the form a root keeps; its own
    entry, the first, is ``g v`` with the new value."""
    node.parent = None
    node.expand(0.0, v, logits, False, state, frame, hidden, step)
    refresh(node, gamma)
    return node


@dataclass(frozen=True)
class Layout:
    """Where each field sits in the tree_reps vector of length N = 9 + 10A + K (v1.1)."""

    num_actions: int
    rec_t: int

    @property
    def length(self) -> int:
        return 9 + 10 * self.num_actions + self.rec_t

    def fields(self) -> list[tuple[str, int]]:
        a = self.num_actions
        node = [
            ("action", a),
            ("r", 1),
            ("v", 1),
            ("logits", a),
            ("qs_mean", a),
            ("qs_max", a),
            ("ns", a),
        ]
        return (
            [(f"root_{name}", n) for name, n in node]
            + [("root_trail_r", 1), ("root_trail_q", 1), ("root_max_v", 1)]
            + [(f"cur_{name}", n) for name, n in node]
            + [("reset", 1), ("time", self.rec_t), ("derec", 1)]
        )

    @cached_property
    def slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for name, n in self.fields():
            out[name] = slice(start, start + n)
            start += n
        return out


_STATS = (
    "root_qs_mean",
    "root_qs_max",
    "root_ns",
    "cur_qs_mean",
    "cur_qs_max",
    "cur_ns",
    "root_trail_r",
    "root_trail_q",
    "root_max_v",
)
MASKED = {1: _STATS, 2: _STATS + ("root_v", "cur_v", "root_logits", "cur_logits")}
"""The fields `stat_mask_type` zeroes: 1 hides what the search found, 2 the model's outputs too."""


def node_stats(node: Node, num_actions: int, rec_t: int) -> np.ndarray:
    """action one-hot, r, v, children's logits, mean and max of their lists, ns: 5A + 2."""
    a = num_actions
    out = np.zeros(5 * a + 2, dtype=np.float32)
    out[node.action] = 1.0  # (a fresh root's action is 0, as in v1.1)
    out[a], out[a + 1] = node.r, node.v
    for i, child in enumerate(node.children or ()):
        out[a + 2 + i] = child.logit
        if child.returns:
            out[2 * a + 2 + i] = np.mean(child.returns)
            out[3 * a + 2 + i] = max(child.returns)
        out[4 * a + 2 + i] = child.rollout_n / rec_t
    return out


def encode(
    root: Node,
    cur: Node,
    reset: bool,
    cur_t: int,
    depth: int,
    gamma: float,
    layout: Layout,
    stat_mask_type: int = 0,
) -> np.ndarray:
    """The tree_reps vector of one env."""
    a, k = layout.num_actions, layout.rec_t
    out = np.empty(layout.length, dtype=np.float32)
    out[: 5 * a + 2] = node_stats(root, a, k)
    out[5 * a + 2] = root.trail_r / gamma
    out[5 * a + 3] = root.rollout_q / gamma
    out[5 * a + 4] = gmax(root, gamma)
    out[5 * a + 5 : 10 * a + 7] = node_stats(cur, a, k)
    out[10 * a + 7] = float(reset)
    out[10 * a + 8 : 10 * a + 8 + k] = 0.0  # the stage's time step, one-hot
    out[10 * a + 8 + cur_t] = 1.0
    out[10 * a + 8 + k] = gamma**depth
    if stat_mask_type:
        for name in MASKED[stat_mask_type]:
            out[layout.slices[name]] = 0.0
    return out


def gmax(root: Node, gamma: float) -> float:
    """The best return G over the visited nodes (the root's list holds g * G)."""
    return (max(root.returns) - root.r) / gamma if root.returns else 0.0


def baseline(root: Node, gamma: float) -> float:
    """The mean return G over the visited nodes: the tree's estimate of the root's value."""
    return float(np.mean(root.returns)) / gamma if root.returns else 0.0


def decode_tree_reps(tree_reps: Any, num_actions: int, enc_type: int = 0) -> dict[str, Any]:
    """Name the fields of a batch of tree_reps [n, N] (numpy or torch): each key maps to
    ``tree_reps[:, slice]``; scalars keep a trailing dim of 1, except ``reset`` (1-D); ``raw``
    is the input. `enc_type` is the seed's and must be 0 (its other values were broken)."""
    if enc_type != 0:
        raise ValueError("decode_tree_reps supports enc_type 0 only")
    length = tree_reps.shape[-1]
    rec_t = length - 9 - 10 * num_actions
    if rec_t < 1:
        raise ValueError(
            f"tree_reps of length {length} does not fit {num_actions} actions: "
            "N = 9 + 10A + K with K >= 1"
        )
    out = {name: tree_reps[..., s] for name, s in Layout(num_actions, rec_t).slices.items()}
    out["reset"] = out["reset"][..., 0]
    out["raw"] = tree_reps
    return out
