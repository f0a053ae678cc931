"""The learner: runs `learn_mode.forward` on batches and calls hooks around it.

Hooks run at four positions (before_run, after_run, before_iter, after_iter), so that
checkpointing and logging are pluggable instead of baked into the training loop. Two built-in
hooks: `CheckpointHook` (atomic torch checkpoints every N iterations) and `LogHook`
(TensorBoard event files plus a CSV of the same scalars).

An update made of several gradient steps (PPO's epochs x minibatches) can also run a step at
a time: `plan` freezes it (the batch, every step's rows, drawn now) into an `UpdatePlan`, and
`train_step` runs its next step. The learner iteration is still the whole update (its counter,
`last_info` and iteration hooks move with the plan's last step), so `log_every` and
`checkpoint_every` mean the same either way. A trainer uses this to bound the work of one
request (`mistk_rl.rl.pacing`).

Batches come from CPU buffers and rollouts; the learner is where they move to the policy's
device (`LearnMode.device`, `mistk_rl.rl.device`), for a whole update at once.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, NamedTuple, Optional, TextIO, TypeVar

import numpy as np
import torch

from mistk_rl.files import atomic_write_bytes
from mistk_rl.rl.data.collate import to_device
from mistk_rl.rl.data.samples import Samples

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

POSITIONS = ("before_run", "after_run", "before_iter", "after_iter")

SamplesT = TypeVar("SamplesT", bound=Samples)
"""The kind of batch a policy learns from (`policies.base.Policy`)."""


@dataclass
class UpdatePlan(Generic[SamplesT]):
    """One update laid out as gradient steps, frozen when it is planned: the batch, each
    step's rows of it (random draws happen at planning, so running the steps later, or
    interleaved with acting, draws nothing), the settings of the moment (lr, clip, ...), and
    what was reported so far: figures of the batch itself, given at planning (PPO's explained
    variance), and each step done."""

    batch: SamplesT
    rows: list[torch.Tensor]  # step i trains on batch rows rows[i]
    settings: dict[str, float]
    done: int = 0
    stats: dict[str, list[float]] = field(default_factory=dict)

    @property
    def left(self) -> int:
        return len(self.rows) - self.done

    def info(self) -> dict[str, Any]:
        """The update's info: each scalar's mean over its steps, and the settings."""
        return {
            **{key: float(np.mean(values)) for key, values in self.stats.items()},
            **self.settings,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch._asdict(),
            "rows": list(self.rows),
            "settings": dict(self.settings),
            "done": self.done,
            "stats": {key: list(values) for key, values in self.stats.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], batch_type: type[SamplesT]) -> UpdatePlan[SamplesT]:
        return cls(
            batch_type(**state["batch"]),
            list(state["rows"]),
            dict(state["settings"]),
            int(state["done"]),
            {k: list(v) for k, v in state["stats"].items()},
        )


class LearnMode(NamedTuple):
    """What a learner runs: a policy's `learn_mode` (`policies.base.Policy`). The batches
    are of the policy's kind (`SamplesT`: the trainer it names builds them), which the
    callables leave untyped: a NamedTuple takes no type parameter before Python 3.11."""

    forward: Callable[[Any], dict]  # one update on a batch -> scalars (+ priority)
    state_dict: Callable[[], dict]
    load_state_dict: Callable[[dict], None]
    # the same update a step at a time (module doc); None: `forward` is one gradient step
    plan: Optional[Callable[[Any], UpdatePlan[Any]]] = None
    step: Optional[Callable[[Any], dict[str, float]]] = None  # the next step's scalars
    device: torch.device = torch.device("cpu")  # where the batches the steps take must be


class Hook:
    """Called as `hook(learner)` at `position`, every `every` iterations (iter hooks)."""

    def __init__(self, position: str, every: int = 1) -> None:
        if position not in POSITIONS:
            raise ValueError(f"hook position {position!r}; valid: {', '.join(POSITIONS)}")
        self.position, self.every = position, max(1, every)

    def __call__(self, learner: "Learner") -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the hook holds (files, writers); the learner calls it when closed."""


class Learner:
    """Counts iterations, keeps the last info, runs hooks."""

    def __init__(self, learn_mode: LearnMode, hooks: Optional[list[Hook]] = None) -> None:
        self.learn_mode = learn_mode
        self.train_iter = 0
        self.env_steps = 0  # kept by the caller: hooks log against it too
        self.last_info: dict[str, Any] = {}
        self.hooks: dict[str, list[Hook]] = {p: [] for p in POSITIONS}
        self._running = False
        for hook in hooks or []:
            self.register_hook(hook)

    def register_hook(self, hook: Hook) -> None:
        self.hooks[hook.position].append(hook)

    def start(self) -> None:
        if not self._running:
            self._running = True
            self._call("before_run")

    def close(self) -> None:
        if self._running:
            self._call("after_run")
            self._running = False
        for hook in (h for hooks in self.hooks.values() for h in hooks):
            hook.close()

    def train(self, batch: Samples) -> dict[str, Any]:
        """One update; returns the policy's info (loss, ... and maybe per-sample priority)."""
        self.start()
        self._call("before_iter")
        info = self.learn_mode.forward(to_device(batch, self.learn_mode.device))
        self.train_iter += 1
        self.last_info = info
        self._call("after_iter")
        return info

    def plan(self, batch: SamplesT) -> UpdatePlan[SamplesT]:
        """Freeze the update `train(batch)` would run into steps for `train_step`."""
        plan = self.learn_mode.plan
        if plan is None:
            raise _single_step()
        return plan(to_device(batch, self.learn_mode.device))

    def restore_plan(
        self, state: dict[str, Any], batch_type: type[SamplesT]
    ) -> UpdatePlan[SamplesT]:
        """A plan from `UpdatePlan.state_dict` (a checkpoint's, loaded on the CPU), its batch
        on the device as `plan` puts it."""
        plan = UpdatePlan.from_state(state, batch_type)
        plan.batch = to_device(plan.batch, self.learn_mode.device)
        return plan

    def train_step(self, plan: UpdatePlan[Any]) -> Optional[dict[str, Any]]:
        """Run `plan`'s next step; with its last, the iteration completes and the update's
        info is returned (None before). `train(batch)` and planning the same batch, then
        stepping it through, run the same computation."""
        step = self.learn_mode.step
        if step is None:
            raise _single_step()
        self.start()
        if plan.done == 0:
            self._call("before_iter")
        for key, value in step(plan).items():
            plan.stats.setdefault(key, []).append(value)
        plan.done += 1
        if plan.left:
            return None
        self.train_iter += 1
        self.last_info = plan.info()
        self._call("after_iter")
        return self.last_info

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.learn_mode.state_dict(),
            "train_iter": self.train_iter,
            "env_steps": self.env_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learn_mode.load_state_dict(state["policy"])
        self.train_iter = int(state.get("train_iter", 0))
        self.env_steps = int(state.get("env_steps", 0))

    def _call(self, position: str) -> None:
        for hook in self.hooks[position]:
            if position.endswith("_iter") and self.train_iter % hook.every:
                continue
            hook(self)


def _single_step() -> TypeError:
    """What planning an update that is one gradient step raises (`LearnMode.plan` None)."""
    return TypeError("this policy's update is one gradient step: it has no plan to step through")


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """torch.save into memory, then an atomic write: a crash never leaves half a file."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(Path(path), buffer.getvalue())


# What `weights_only` loading lets through besides tensors and plain data: numeric numpy
# arrays and scalars (replay buffers, rollouts and RNG states are numpy). Each is data that
# numpy rebuilds from bytes; an object array would still need its items' classes, so no code.
_NUMPY_DATA = [
    np.zeros(1).__reduce__()[0],
    np.ndarray,
    np.dtype,  # _reconstruct
    np.float64(0).__reduce__()[0],  # numpy's scalar constructor
    *{type(np.dtype(code)) for code in "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]},
]


def load_checkpoint(path: Path) -> dict[str, Any]:
    """`weights_only` loading: a checkpoint can hold tensors, numeric numpy arrays and plain
    data, never code."""
    with torch.serialization.safe_globals(_NUMPY_DATA):
        return torch.load(Path(path), map_location="cpu", weights_only=True)


class CheckpointHook(Hook):
    """Saves `state()` (default: `learner.state_dict()`) every `every` iterations. An agent
    passes the same function its saveModel uses, so every checkpoint it writes loads the same
    way."""

    def __init__(
        self,
        path: Path,
        every: int = 10000,
        position: str = "after_iter",
        state: Optional[Callable[[], dict]] = None,
    ) -> None:
        super().__init__(position, every)
        self.path, self.state = Path(path), state

    def __call__(self, learner: Learner) -> None:
        save_checkpoint(self.state() if self.state else learner.state_dict(), self.path)


class LogHook(Hook):
    """Writes the policy's scalar info every `every` iterations to TensorBoard and a CSV.

    TensorBoard's x axis is env steps, as the harness's evaluation and episode scalars, so
    every chart of a run lines up; the learner iteration is a scalar of its own
    (``learner/train_iter``). The CSV has both columns. `resumed_at` (a learner resumed from
    a checkpoint taken at that iteration, after `resumed_env_steps` env steps) keeps the
    earlier rows up to it and drops the later ones, which the run before the crash wrote and
    this one writes again (TensorBoard's `purge_step`).
    """

    def __init__(
        self,
        log_dir: Path,
        every: int = 100,
        resumed_at: Optional[int] = None,
        resumed_env_steps: Optional[int] = None,
    ) -> None:
        super().__init__("after_iter", every)
        self.log_dir = Path(log_dir)
        self.resumed_at, self.resumed_env_steps = resumed_at, resumed_env_steps
        self._writer: Optional[SummaryWriter] = None
        self._csv: Optional[TextIO] = None
        self._columns: list[str] = []

    def __call__(self, learner: Learner) -> None:
        scalars = {
            k: float(v)
            for k, v in learner.last_info.items()
            if isinstance(v, (int, float)) and math.isfinite(float(v))
        }
        if not scalars:
            return
        self._write_tensorboard(learner, scalars)
        self._write_csv(learner, scalars)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._csv is not None:
            self._csv.close()
            self._csv = None

    def _write_tensorboard(self, learner: Learner, scalars: dict[str, float]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: lazily

            purge = None if self.resumed_env_steps is None else self.resumed_env_steps + 1
            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)
        for key, value in scalars.items():
            self._writer.add_scalar(f"learner/{key}", value, learner.env_steps)
        self._writer.add_scalar("learner/train_iter", learner.train_iter, learner.env_steps)
        self._writer.flush()

    def _write_csv(self, learner: Learner, scalars: dict[str, float]) -> None:
        if self._csv is None:
            self._csv = self._open_csv(scalars)
        row = {"train_iter": learner.train_iter, "env_steps": learner.env_steps, **scalars}
        csv.writer(self._csv).writerow([row.get(c, "") for c in self._columns])
        self._csv.flush()

    def _open_csv(self, scalars: dict[str, float]) -> TextIO:
        path = self.log_dir / "learner.csv"
        self._columns = ["train_iter", "env_steps", *sorted(scalars)]
        kept: list[list[str]] = []
        if self.resumed_at is not None and path.exists():
            with open(path, newline="") as fh:
                rows = list(csv.reader(fh))
            if rows:
                self._columns = rows[0]
                kept = [r for r in rows[1:] if r and int(r[0]) <= self.resumed_at]
        text = io.StringIO()
        csv.writer(text).writerows([self._columns, *kept])
        atomic_write_bytes(path, text.getvalue().encode())
        return open(path, "a", newline="")
