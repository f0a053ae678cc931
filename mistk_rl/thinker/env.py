"""The Thinker-augmented MDP over a batch of envs (the seed's `thinker.make` API, v1.1).

A stage is K steps: K-1 imaginary ones, in which the agent walks a search tree from the root
(the current real state) with a primary action and may reset to the root, then one real step,
whose primary action is taken in the real env from the root. The agent sees the tree's
statistics (`tree_reps`) and the root's frame (`real_states`); the planning reward
(`im_reward`) is the rise of the best return found. Envs run in lock-step, so every env is at
the same step of its stage.

The tree is expanded by the real env's dynamics (wrapper_type 2, the perfect model: the env's
state is cloned at every node and restored to expand it) or by a learned model (0); 1 is the
raw env. Differences from v1.1, each a fix or an extension the issue asks for: real_states is
the new root's frame from the real step on; the planning reward's reference after reset() is
Gmax(root), not 0; unknown settings are errors; 1-D observations are accepted; arrays are
numpy, not torch (CPU only).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, cast

import gymnasium as gym
import numpy as np

from mistk_rl.thinker import tree
from mistk_rl.thinker.config import ThinkerConfig, load_config
from mistk_rl.thinker.tree import Node

if TYPE_CHECKING:  # (both import torch: at run time only when the settings need them)
    from mistk_rl.thinker.cloneable import Snapshots
    from mistk_rl.thinker.model import ThinkerModel

EnvFn = Callable[[], gym.Env]
Step = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, dict[str, Any]]
"""What `step` returns: the state, the rewards, the dones and the info."""

STATUS_REAL, STATUS_IMAGINARY, STATUS_LAST_IMAGINARY = 0, 1, 2
"""step_status after a step: a real step was just taken; an imaginary one, and the next is
imaginary too; an imaginary one, and the next is real."""


class ThinkerEnv:
    """`env_n` copies of an env behind the augmented MDP. Build it with `make`.

    `auto_reset` (the seed's behaviour) resets an env whose episode ends within the real step,
    so the state returned is already the next episode's; a truncated episode's final state
    (what it bootstraps from) is then `info["final_state"]`, env index -> its row. Off, the
    state returned is the final real state's (a fresh root there), and `step` is refused
    until `reset()`: the gymnasium convention, which the adapter serves.
    """

    def __init__(
        self, env_fns: Sequence[EnvFn], cfg: ThinkerConfig, auto_reset: bool = True
    ) -> None:
        if not env_fns:
            raise ValueError("the Thinker MDP needs at least one env")
        self.cfg = cfg
        self.envs = [fn() for fn in env_fns]
        self.env_n = len(self.envs)
        space = self.envs[0].action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ValueError(f"the Thinker MDP needs a Discrete action space, not {space}")
        self.num_actions = int(space.n)
        self.real_observation_space = self.envs[0].observation_space
        if cfg.wrapper_type == 2:
            from mistk_rl.thinker.cloneable import ensure_cloneable

            self.envs = [ensure_cloneable(env) for env in self.envs]
        self.model: Optional[ThinkerModel] = None
        # an untrained value-policy net with zero heads answers v = 0, logits = 0 exactly:
        # the perfect model then needs no network at all
        zero_vp = not cfg.train_model and cfg.model_zero_init
        if cfg.wrapper_type == 0 or (cfg.wrapper_type == 2 and cfg.vp_fn is None and not zero_vp):
            from mistk_rl.thinker.model import ThinkerModel  # (torch: only when needed)

            self.model = ThinkerModel(cfg, self.real_observation_space, self.num_actions)
        self.layout = tree.Layout(self.num_actions, cfg.rec_t)
        self.observation_space = self._observation_space()
        self.real_steps = 0  # real steps of the batch since make()
        self.auto_reset = auto_reset
        self._seeded = False
        n = self.env_n
        self.roots: list[Node] = []
        self.curs: list[Node] = []
        self.frames: list[Any] = [None] * n  # each env's real frame: the root's
        self.cur_t = 0
        self.depth = np.zeros(n, dtype=np.int64)
        self.stage_depth = np.zeros(n, dtype=np.int64)  # deepest node reached this stage
        self.gmax_prev = np.zeros(n, dtype=np.float32)
        self.baseline = np.zeros(n, dtype=np.float32)
        self.episode_step = np.zeros(n, dtype=np.int64)
        self.episode_return = np.zeros(n, dtype=np.float64)
        self.im_episode_return = np.zeros(n, dtype=np.float64)
        self.ended = np.zeros(n, dtype=bool)  # without auto_reset: episodes awaiting reset()

    # ---- the seed's API ------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None) -> dict[str, np.ndarray]:
        """Reset every env (env i with seed + i; by default the setting's seed, the first
        time) and return the first state. Episodes later reset themselves."""
        if seed is None and not self._seeded:
            seed = self.cfg.seed
        frames = [
            env.reset(seed=None if seed is None else seed + i)[0] for i, env in enumerate(self.envs)
        ]
        self._seeded = True
        self.ended[:] = False
        self.frames = frames
        self.cur_t = 0
        self.depth[:] = 0
        self.stage_depth[:] = 0
        self.episode_step[:] = 0
        self.episode_return[:] = 0.0
        self.im_episode_return[:] = 0.0
        self.baseline[:] = 0.0
        if self.cfg.planning:
            self._plant(np.zeros(self.env_n, dtype=np.int64), np.ones(self.env_n, dtype=bool))
        return self._state(resets=np.ones(self.env_n, dtype=bool))

    def step(
        self,
        primary_action: Any,
        reset_action: Any = None,
        action_prob: Optional[np.ndarray] = None,
    ) -> Step:
        """One augmented step: imaginary while the stage lasts, then real."""
        if not self.roots and self.cfg.planning or self.frames[0] is None:
            raise RuntimeError("call reset() before step()")
        if self.ended.any():
            raise RuntimeError(
                f"the episodes of envs {np.flatnonzero(self.ended).tolist()} "
                "have ended and auto_reset is off: call reset()"
            )
        primary = self._actions(primary_action, self.num_actions, "primary_action")
        resets = (
            np.zeros(self.env_n, dtype=np.int64)
            if reset_action is None
            else self._actions(reset_action, 2, "reset_action")
        )
        if self.cfg.require_prob and action_prob is None and self.next_step_real:
            raise ValueError("require_prob is set: pass action_prob [env_n, A] with each step")
        if not self.next_step_real:
            return self._imaginary_step(primary, resets.astype(bool))
        return self._real_step(primary, action_prob)

    @property
    def next_step_real(self) -> bool:
        """Whether the next `step` is the stage's last, whose primary action the real envs
        take (a caller that drives the real envs by another rule acts on it)."""
        return self.cur_t == self.cfg.rec_t - 1

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.model is not None:
            self.model.close()

    # ---- imaginary steps -----------------------------------------------------------------
    def _imaginary_step(self, primary: np.ndarray, resets: np.ndarray) -> Step:
        cfg, gamma = self.cfg, self.cfg.discounting
        self.cur_t += 1
        children = [cur.expanded_children()[a] for cur, a in zip(self.curs, primary)]
        pending = []
        again = [child.expanded and not self._is_expanded(child) for child in children]
        for i, (cur, child) in enumerate(zip(self.curs, children)):
            if self._is_expanded(child):
                continue
            if cur.done:  # past the end of an episode nothing more happens
                child.expand(
                    0.0,
                    0.0,
                    np.array([c.logit for c in cur.expanded_children()]),
                    True,
                    cur.state,
                    cur.frame,
                    cur.hidden,
                    self.real_steps,
                )
            else:
                pending.append(i)
        if pending:
            self._expand(pending, [children[i] for i in pending], primary[pending])
        for child in (c for c, a in zip(children, again) if a):  # a carried node, re-expanded:
            tree.refresh(child, gamma)  # the returns through it as it is now (v1.1 override)
        im_reward = np.zeros(self.env_n, dtype=np.float32)
        reps = np.empty((self.env_n, self.layout.length), dtype=np.float32)
        for i, child in enumerate(children):
            self.curs[i] = child
            self.depth[i] += 1
            self.stage_depth[i] = max(self.stage_depth[i], self.depth[i])
            tree.visit(child, gamma)
            best = tree.gmax(self.roots[i], gamma)
            im_reward[i] = best - self.gmax_prev[i]
            if cfg.wrapper_type == 0:  # a learned model's returns may fall on re-expansion
                im_reward[i] = max(im_reward[i], 0.0)
            self.gmax_prev[i] = best
            resets[i] = resets[i] or (cfg.max_depth > 0 and self.depth[i] >= cfg.max_depth)
            reps[i] = self._encode(i, bool(resets[i]))
            if resets[i]:
                self.depth[i] = 0
                self.curs[i] = self.roots[i]
                tree.visit(self.roots[i], gamma)
        if not cfg.im_enable:
            im_reward[:] = 0.0
        self.im_episode_return += im_reward
        self.episode_step += 1
        status = STATUS_IMAGINARY if self.cur_t < cfg.rec_t - 1 else STATUS_LAST_IMAGINARY
        zeros = np.zeros(self.env_n, dtype=bool)
        info = self._info(status, im_reward, zeros, zeros, self.stage_depth.copy())
        state = self._state(reps=reps, nodes=children)  # (hs, xs: the nodes reached)
        return state, np.zeros(self.env_n, dtype=np.float32), zeros.copy(), info

    def _is_expanded(self, node: Node) -> bool:
        """A perfect model never expands a node twice; a learned one re-expands nodes carried
        over a real step, from the new root's state."""
        if self.cfg.wrapper_type == 0:
            return node.expanded and node.expanded_at >= self.real_steps
        return node.expanded

    def _expand(self, envs: list[int], children: list[Node], actions: np.ndarray) -> None:
        """Expand a child of each env's non-terminal cur, with one batched model call."""
        cfg, step = self.cfg, self.real_steps
        parents = [self.curs[i] for i in envs]
        if cfg.wrapper_type == 0:
            out = self._learned_model().unroll([p.state for p in parents], actions)
            for j, child in enumerate(children):
                child.expand(
                    out.reward[j],
                    out.v[j],
                    out.logits[j],
                    bool(out.done[j]),
                    out.states[j],
                    None if out.xs is None else out.xs[j],
                    None if out.hs is None else out.hs[j],
                    step,
                )
            return
        frames, results = [], []
        for i, parent, a in zip(envs, parents, actions):
            env = self.envs[i]
            _snapshots(env).restore_state(parent.state)
            frame, r, terminated, truncated, _ = env.step(int(a))
            results.append(
                (self._clip(float(r)), terminated or truncated, _snapshots(env).clone_state())
            )
            frames.append(frame)
        v, logits = self._value_policy(np.stack(frames), actions)
        for j, (child, (r, done, state)) in enumerate(zip(children, results)):
            child.expand(r, v[j], logits[j], done, state, frames[j], None, step)

    # ---- real steps ----------------------------------------------------------------------
    def _real_step(self, primary: np.ndarray, action_prob: Optional[np.ndarray]) -> Step:
        """The stage's last step: the real envs take `primary` from the roots, the model
        records it (and may train), and the next stage starts at new roots."""
        cfg = self.cfg
        before = list(self.frames)
        if cfg.planning:
            self.baseline = np.array(
                [tree.baseline(r, cfg.discounting) for r in self.roots], dtype=np.float32
            )
        rewards, terminated, truncated, final = self._step_real_envs(primary)
        done, cut = terminated | truncated, truncated & ~terminated
        if self.model is not None and cfg.train_model:
            self.model.record(
                np.stack(before), primary, rewards, done, cut, self.baseline.copy(), action_prob
            )
        self.real_steps += 1
        if self.auto_reset:  # a restarted episode's root is reached by action 0
            reached = np.where(done, 0, primary)
        else:  # the root is the final state, reached by primary; step waits for reset()
            reached, self.ended = primary, done
        if cfg.planning:
            self._plant(reached, done)
        final_states = self._final_states(final, primary) if final else {}
        if self.model is not None and cfg.train_model:
            self.model.train_if_due()
        info = self._end_stage(done, cut)
        if final_states:
            info["final_state"] = final_states
        self._end_episodes(done)
        return self._state(resets=np.ones(self.env_n, dtype=bool)), rewards, done, info

    def _step_real_envs(
        self, primary: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, tuple[Any, Any]]]:
        """Each env's real step from its root: the clipped rewards, terminated, truncated,
        and under auto_reset the truncated envs' last frame and state (what they bootstrap
        from), env index -> (frame, state), an ended episode restarting at once."""
        n, perfect = self.env_n, self.cfg.wrapper_type == 2
        rewards = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        final: dict[int, tuple[Any, Any]] = {}
        for i, env in enumerate(self.envs):
            if perfect:
                _snapshots(env).restore_state(self.roots[i].state)
            frame, r, terminated[i], truncated[i], _ = env.step(int(primary[i]))
            self.episode_return[i] += r
            rewards[i] = self._clip(float(r))
            if (terminated[i] or truncated[i]) and self.auto_reset:
                if truncated[i] and not terminated[i]:  # what it bootstraps from
                    final[i] = (frame, _snapshots(env).clone_state() if perfect else None)
                frame = env.reset()[0]
            self.frames[i] = frame
        return rewards, terminated, truncated, final

    def _end_stage(self, done: np.ndarray, cut: np.ndarray) -> dict[str, Any]:
        """Back to the stage's start (depth and time 0), and the real step's info."""
        self.episode_step += 1
        self.depth[:] = 0
        self.cur_t = 0
        info = self._info(
            STATUS_REAL,
            np.zeros(self.env_n, dtype=np.float32),
            done,
            cut,
            self.stage_depth.copy(),
        )
        self.stage_depth[:] = 0
        return info

    def _end_episodes(self, done: np.ndarray) -> None:
        """The counters of the episodes that ended restart; a stage's planning reward is
        reported at its end."""
        for counter in (self.episode_step, self.episode_return, self.im_episode_return):
            counter[done] = 0
        self.im_episode_return[:] = 0.0

    def _plant(self, actions: np.ndarray, fresh: np.ndarray) -> None:
        """New roots (`_new_roots`), the walk at each, and the best return found so far."""
        self.roots = self._new_roots(actions, fresh)
        self.curs = list(self.roots)
        self.gmax_prev = np.array(
            [tree.gmax(r, self.cfg.discounting) for r in self.roots], dtype=np.float32
        )

    def _new_roots(self, actions: np.ndarray, fresh: np.ndarray) -> list[Node]:
        """The roots after reset() or a real step: the chosen child and its subtree when the
        tree is carried, else a new node; the value and priors from the new real frames."""
        cfg, step = self.cfg, self.real_steps
        frames = np.stack(self.frames)
        if cfg.wrapper_type == 0:
            out = self._learned_model().initial(frames, actions)
            v, logits, states = out.v, out.logits, out.states
            hidden = [None] * self.env_n if out.hs is None else list(out.hs)
        else:
            v, logits = self._value_policy(frames, actions)
            states = [_snapshots(env).clone_state() for env in self.envs]
            hidden = [None] * self.env_n
        roots = []
        for i in range(self.env_n):
            old = self.roots[i] if self.roots else None
            child = None if fresh[i] or old is None else old.expanded_children()[actions[i]]
            if cfg.tree_carry and child is not None and child.expanded:
                root = tree.new_root(
                    child,
                    v[i],
                    logits[i],
                    states[i],
                    cfg.discounting,
                    self.frames[i],
                    hidden[i],
                    step,
                )
            else:
                root = Node(int(actions[i]), None, 0.0)
                root.expand(0.0, v[i], logits[i], False, states[i], self.frames[i], hidden[i], step)
            tree.visit(root, cfg.discounting)
            roots.append(root)
        return roots

    def _final_states(
        self, final: dict[int, tuple[Any, Any]], actions: np.ndarray
    ) -> dict[int, dict[str, np.ndarray]]:
        """Under auto_reset, the state each truncated env's episode bootstraps from: the one
        `step` returns without auto_reset (a fresh root at the final real frame, reached by
        the real action), env index -> its row of the state."""
        cfg, idx = self.cfg, sorted(final)
        frames = np.stack([final[i][0] for i in idx])
        if not cfg.planning:
            return {i: {"real_states": final[i][0]} for i in idx}
        reached = np.asarray(actions)[idx]
        if cfg.wrapper_type == 0:
            out = self._learned_model().initial(frames, reached)
            v, logits, states = out.v, out.logits, out.states
            hidden = [None] * len(idx) if out.hs is None else list(out.hs)
        else:
            v, logits = self._value_policy(frames, reached)
            states, hidden = [final[i][1] for i in idx], [None] * len(idx)
        rows = {}
        for j, i in enumerate(idx):
            root = Node(int(reached[j]), None, 0.0)
            root.expand(
                0.0, v[j], logits[j], False, states[j], final[i][0], hidden[j], self.real_steps
            )
            tree.visit(root, cfg.discounting)
            row = {
                "real_states": final[i][0],
                "tree_reps": tree.encode(
                    root, root, True, 0, 0, cfg.discounting, self.layout, cfg.stat_mask_type
                ),
            }
            if cfg.wrapper_type == 0 and cfg.return_h and hidden[j] is not None:
                row["hs"] = hidden[j]
            if cfg.return_x and root.frame is not None:
                row["xs"] = root.frame
            rows[i] = row
        return rows

    # ---- helpers -------------------------------------------------------------------------
    def _value_policy(
        self, frames: np.ndarray, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.cfg.vp_fn is not None:
            v, logits = self.cfg.vp_fn(frames)
        elif self.model is not None:
            v, logits = self.model.value_policy(frames, actions)
        else:  # untrained, zero heads (see __init__)
            return (
                np.zeros(len(frames), dtype=np.float32),
                np.zeros((len(frames), self.num_actions), dtype=np.float32),
            )
        v = np.asarray(v, dtype=np.float32).reshape(len(frames))
        logits = np.asarray(logits, dtype=np.float32).reshape(len(frames), self.num_actions)
        return v, logits

    def _clip(self, r: float) -> float:
        c = self.cfg.reward_clip
        return float(np.clip(r, -c, c)) if c > 0 else r

    def _encode(self, i: int, reset: bool) -> np.ndarray:
        return tree.encode(
            self.roots[i],
            self.curs[i],
            reset,
            self.cur_t,
            int(self.depth[i]),
            self.cfg.discounting,
            self.layout,
            self.cfg.stat_mask_type,
        )

    def _state(
        self,
        reps: Optional[np.ndarray] = None,
        resets: Optional[np.ndarray] = None,
        nodes: Optional[list[Node]] = None,
    ) -> dict[str, np.ndarray]:
        state = {"real_states": np.stack(self.frames)}
        if not self.cfg.planning:
            return state
        if reps is None:
            assert resets is not None  # (each caller gives the reps or the resets)
            reps = np.stack([self._encode(i, bool(resets[i])) for i in range(self.env_n)])
        state["tree_reps"] = reps
        nodes = self.curs if nodes is None else nodes
        if self.cfg.wrapper_type == 0 and self.cfg.return_h and nodes[0].hidden is not None:
            state["hs"] = np.stack([node.hidden for node in nodes])
        if self.cfg.return_x and nodes[0].frame is not None:
            state["xs"] = np.stack([node.frame for node in nodes])
        return state

    def _info(
        self,
        status: int,
        im_reward: np.ndarray,
        done: np.ndarray,
        truncated: np.ndarray,
        max_depth: np.ndarray,
    ) -> dict[str, Any]:
        return {
            "real_done": done.copy(),
            "truncated_done": truncated.copy(),
            "step_status": np.full(self.env_n, status, dtype=np.int64),
            "max_rollout_depth": max_depth,
            "baseline": self.baseline.copy(),
            "im_reward": im_reward,
            "episode_step": self.episode_step.copy(),
            "episode_return": self.episode_return.astype(np.float32),
            "im_episode_return": self.im_episode_return.astype(np.float32),
            "model_status": self.model_status(),
        }

    def _learned_model(self) -> ThinkerModel:
        """The learned model, which wrapper_type 0 builds."""
        assert self.model is not None
        return self.model

    def model_status(self) -> dict[str, Any]:
        if self.model is None or not self.cfg.train_model:
            return {"processed_n": 0, "warm_up_n": 0, "running": False, "finish": True}
        return self.model.status()

    def _actions(self, values: Any, n: int, name: str) -> np.ndarray:
        actions = np.asarray(values).reshape(-1)
        if (
            actions.shape != (self.env_n,)
            or not np.issubdtype(actions.dtype, np.integer)
            and not np.all(np.equal(np.mod(actions, 1), 0))
        ):
            raise ValueError(f"{name} must hold {self.env_n} integers, got {values!r}")
        actions = actions.astype(np.int64)
        if actions.min() < 0 or actions.max() >= n:
            raise ValueError(f"{name} must be in [0, {n}), got {actions.tolist()}")
        return actions

    def _observation_space(self) -> gym.spaces.Dict:
        spaces: dict[str, gym.Space] = {"real_states": self.real_observation_space}
        cfg, real = self.cfg, self.real_observation_space
        if not cfg.planning:
            return gym.spaces.Dict(spaces)
        spaces["tree_reps"] = gym.spaces.Box(-np.inf, np.inf, (self.layout.length,), np.float32)
        if cfg.wrapper_type == 0 and cfg.return_h:
            spaces["hs"] = gym.spaces.Box(
                -np.inf, np.inf, self._learned_model().h_shape, np.float32
            )
        if cfg.return_x:  # a learned model's frames are predictions: floats in the bounds
            spaces["xs"] = (
                real
                if cfg.wrapper_type == 2
                else gym.spaces.Box(
                    self._learned_model().scale.low,
                    self._learned_model().scale.high,
                    real.shape,
                    np.float32,
                )
            )
        return gym.spaces.Dict(spaces)


def make(
    name: Optional[str] = None,
    env_fn: Optional[EnvFn] = None,
    env_n: int = 1,
    gpu: bool = False,
    config: Any = None,
    **cfg: Any,
) -> ThinkerEnv:
    """The Thinker-augmented MDP over `env_n` copies of the env `name` (a gymnasium id) or
    `env_fn()`. Settings: `config` (a YAML path or a mapping) then keywords; see ThinkerConfig.
    """
    if gpu:
        raise ValueError("this implementation runs on CPU only: pass gpu=False")
    if (name is None) == (env_fn is None):
        raise ValueError("give exactly one of name (a gymnasium id) or env_fn")
    if env_n < 1:
        raise ValueError(f"env_n must be >= 1, not {env_n}")
    settings = load_config(config, **cfg)
    if env_fn is None:
        assert name is not None  # (exactly one of the two: checked above)
        env_fn = functools.partial(gym.make, name)
    return ThinkerEnv([env_fn] * env_n, settings)


def _snapshots(env: gym.Env) -> Snapshots:
    """A real env of the perfect model (wrapper_type 2), whose envs `ensure_cloneable`
    gave clone_state() and restore_state()."""
    return cast("Snapshots", env)
