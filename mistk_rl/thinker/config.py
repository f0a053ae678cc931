"""The Thinker-augmented MDP's settings: defaults, then a YAML file, then keywords.

Keys keep the names of the seed's `default_thinker.yaml` (v1.1) so its documentation reads
across; `train_model`, `model_zero_init`, `vp_fn` and `seed` are this project's. An unknown key
is an error (v1.1 ignores it silently, so a typo such as `rec_tt` silently ran K = 20).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from mistk_rl.rl.config import deep_merge, load_config_file

VPFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""A value-policy function: a batch of observations [n, ...] -> (values [n], logits [n, A])."""


@dataclass
class ThinkerConfig:
    # ---- the augmented MDP ---------------------------------------------------------------
    rec_t: int = 20  # K: a stage is K-1 imaginary steps, then one real step
    max_depth: int = 5  # L: the reset is forced at this depth (0: never)
    discounting: float = 0.97  # gamma of the tree's returns
    tree_carry: bool = True  # keep the chosen child's subtree across the real step
    wrapper_type: int = 0  # 0 learned model, 1 raw env, 2 perfect model
    im_enable: bool = True  # report the planning reward (im_reward)
    reward_clip: float = -1.0  # > 0: rewards clipped to [-clip, clip] (returns unclipped)
    stat_mask_type: int = 0  # 1: hide qs/ns/root returns; 2: also v and logits
    return_h: bool = True  # state["hs"]: the model's hidden state of cur (learned)
    return_x: bool = False  # state["xs"]: the predicted frame of cur (learned)
    require_prob: bool = False  # step() expects action_prob, the policy target
    # ---- the model (wrapper_type 0; the value-policy net also for 2) ---------------------
    train_model: bool = True  # False: no training inside step()
    model_zero_init: bool = True  # zero value/policy heads: an untrained model gives 0, 0
    model_size_nn: int = 1  # width multiplier
    model_unroll_len: int = 5  # k: unroll and n of the n-step value target
    model_batch_size: int = 128
    model_buffer_n: int = 200_000  # real transitions kept
    model_warm_up_n: int = 200_000  # real transitions before training starts
    model_min_replay_ratio: float = 5.0
    model_max_replay_ratio: float = 6.0
    model_lr: float = 1e-4
    model_rs_loss_cost: float = 1.0
    model_done_loss_cost: float = 1.0
    model_img_loss_cost: float = 10.0
    model_vs_loss_cost: float = 0.25
    model_logits_loss_cost: float = 0.5
    model_grad_norm_clip: float = 0.0  # 0: no clipping
    priority_alpha: float = 0.6
    priority_beta: float = 0.4  # annealed to 1 over total_steps
    # > 0: a window's priority adds this times its reward error (the root of the unroll's
    # summed squared error), so rare rewards are replayed until learned; 0 is v1.1's
    model_reward_priority: float = 0.0
    buffer_traj_len: int = 50
    total_steps: int = 50_000_000  # real steps: the learning-rate and beta schedules' end
    # ---- runs ----------------------------------------------------------------------------
    xpid: Optional[str] = None  # experiment id: checkpoints under savedir/xpid
    savedir: str = "runs/thinker"
    ckp: bool = False  # resume savedir/xpid's model checkpoint
    ckp_every_s: float = 600.0
    seed: Optional[int] = None
    vp_fn: Optional[VPFn] = field(default=None, repr=False)  # replaces the value-policy net

    def __post_init__(self) -> None:
        if self.wrapper_type not in (0, 1, 2):
            raise ValueError(
                f"wrapper_type must be 0 (learned model), 1 (raw env) or 2 "
                f"(perfect model), not {self.wrapper_type!r}"
            )
        if self.rec_t < 1:
            raise ValueError(f"rec_t (K) must be >= 1, not {self.rec_t}")
        if self.max_depth < 0:
            raise ValueError(f"max_depth (L) must be >= 0, not {self.max_depth}")
        if not 0.0 < self.discounting <= 1.0:
            raise ValueError(f"discounting must be in (0, 1], not {self.discounting}")
        if self.stat_mask_type not in (0, 1, 2):
            raise ValueError(f"stat_mask_type must be 0, 1 or 2, not {self.stat_mask_type}")
        if self.model_unroll_len < 1:
            raise ValueError(f"model_unroll_len must be >= 1, not {self.model_unroll_len}")
        if self.model_reward_priority < 0:
            raise ValueError(
                f"model_reward_priority must be >= 0, not {self.model_reward_priority}"
            )
        if self.vp_fn is not None and not callable(self.vp_fn):
            raise ValueError("vp_fn must be callable: observations -> (values, logits)")
        if self.wrapper_type == 1:
            self.rec_t = 1  # the raw env: every step is real

    @property
    def planning(self) -> bool:
        """Whether there is a tree at all (not the raw env)."""
        return self.wrapper_type != 1


def load_config(
    config: str | Path | dict[str, Any] | None = None, **overrides: Any
) -> ThinkerConfig:
    """Defaults, then `config` (a YAML or JSON file's path, or a mapping), then `overrides`,
    merged strictly as every config here is (`mistk_rl.rl.config.deep_merge`): an unknown
    key or a mistyped number is an error that names it."""
    if isinstance(config, (str, Path)):
        config = load_config_file(config)
    values = {**(config or {}), **overrides}
    vp_fn = values.pop("vp_fn", None)  # a callable: passed as is, never deep-copied
    defaults = {f.name: f.default for f in dataclasses.fields(ThinkerConfig) if f.name != "vp_fn"}
    return ThinkerConfig(**deep_merge(defaults, values, path="thinker"), vp_fn=vp_fn)
