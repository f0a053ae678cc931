"""Trainers: what to do with transitions as they stream in from the environment.

An agent service does not own its environment loop: transitions arrive one replayAction at a
time, for one or more entities. A trainer turns that stream into learner updates.

- `OffPolicyTrainer` (DQN): per-entity n-step accumulation into a replay buffer, then
  `gradient_steps` updates owed every `train_freq` env steps once `learning_starts` is reached,
  feeding new priorities back to a prioritized buffer. With a `Normalizer`, the buffer holds
  raw observations and rewards and each sampled batch is normalised with the statistics of
  the moment (SB3's off-policy handling of VecNormalize; an n-step reward, a discounted sum,
  is scaled as a whole, and clipped as a whole).
- `OnPolicyTrainer` (PPO): per-entity rollouts; every `n_steps` transitions, GAE, and the
  learner's update on the whole rollout frozen into its minibatch steps (`UpdatePlan`).

Neither runs what falls due at once: both owe it, and a pacer (`mistk_rl.rl.pacing`, the
`train` section's learn_in, updates_per_request and max_update_seconds_per_request) pays a
bounded number of steps per request, or runs them on a learner thread beside the requests.
The debt (and PPO's plans) is part of `state_dict`, so a resumed run pays what was owed.

A policy names its trainer (`Policy.trainer_cls`); an agent builds it from its config
(`agent_config`, `from_agent_config`) and drives it through the `Trainer` protocol, so the
agent never asks which kind of learner it serves.

Both save what they hold between updates (`state_dict`) for an agent's checkpoint. A
checkpoint outlives the env episodes that were in progress when it was taken (an
orchestrator cannot restore those), so `load_state_dict` ends them as cut episodes, as
gymnasium's truncation does: n-step windows go to the buffer as they stand, and a rollout's
last step per entity bootstraps from the value of its next observation.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping, Optional, Protocol, Sequence

import numpy as np
import torch

from mistk_rl.rl import pacing
from mistk_rl.rl.config import AgentConfigError
from mistk_rl.rl.data.buffers import BUFFERS
from mistk_rl.rl.data.collate import Batch, concat, to_batch_tensor
from mistk_rl.rl.data.returns import gae
from mistk_rl.rl.data.samples import ReplaySamples, RolloutSamples
from mistk_rl.rl.data.transition_batch import NStepColumns, TransitionBatch
from mistk_rl.rl.learner import Learner, UpdatePlan
from mistk_rl.rl.normalize import Normalizer

Augment = Callable[[dict], list[dict]]  # a transition -> those to store (e.g. its symmetries)


class TrainedPolicy(Protocol):
    """What a trainer reads of its policy: the merged config (learn.batch_size, gamma, ...)."""

    config: dict


class ValuePolicy(TrainedPolicy, Protocol):
    def value(self, obs: Batch) -> torch.Tensor:
        """V(obs), to bootstrap a rollout's last step."""


class Buffer(Protocol):
    """What `OffPolicyTrainer` needs of a replay buffer (`data.buffers.ReplayBuffer`)."""

    takes_priority_feedback: bool  # `update` uses the learner's priorities

    def push(self, data: list[dict] | TransitionBatch, collect_iter: int = 0) -> bool: ...
    def sample_batch(self, size: int, learner_iter: int = 0) -> Optional[ReplaySamples]: ...
    def update(self, info: dict) -> None: ...
    def count(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class Trainer(Protocol):
    """What an agent service drives, whatever the algorithm: each env step's transitions in,
    learner updates out on the trainer's own schedule, its state into checkpoints."""

    # True: the trainer stores raw transitions and normalises each sample it draws (a
    # replayed transition outlives many statistics updates); False: it stores transitions as
    # the policy saw them, normalised by the agent
    normalizes_samples: ClassVar[bool]

    @classmethod
    def agent_config(cls, hparams: Mapping[str, Any]) -> dict:
        """The defaults of the agent config's sections this trainer reads (`train`, ...),
        given the user's config (some defaults depend on a choice in it)."""

    @classmethod
    def from_agent_config(
        cls,
        policy: Any,
        learner: Learner,
        config: dict,
        *,
        seed: Optional[int],
        normalizer: Optional[Normalizer],
        augment: Optional[Augment],
    ) -> Trainer:
        """Built from the agent's merged config, for the policy that names this trainer
        (`Policy.trainer_cls`): each trainer's own method types what it reads of it
        (`TrainedPolicy`, `ValuePolicy`)."""

    @property
    def warming_up(self) -> bool:
        """Act with a uniformly random policy for now (a replay's first data)."""

    def observe_all(self, transitions: Mapping[str, dict]) -> None:
        """One env step's transition per entity."""

    def observe_steps(self, steps: Sequence[Mapping[str, dict]]) -> None:
        """Several env steps in time order, each as `observe_all` takes it (local
        inference's batch): stored as those calls one after another would store them."""

    def observe_columns(self, keys: Sequence[Any], batch: TransitionBatch) -> None:
        """Env steps as columns (what the service's step path gives), `keys` each row's
        entity, in arrival order: stored as `observe_steps` of the same rows would."""

    def maybe_train(self) -> int:
        """Owe the updates due now and pay some of what is owed (`mistk_rl.rl.pacing`); how
        many gradient steps ran."""

    def updates_due(self, new_steps: int) -> bool:
        """Whether `maybe_train`, once `new_steps` more env steps (counted in the learner's
        `env_steps` already) are observed, may change the acting weights: steps owed, or
        falling due with these. An agent learns from such env steps before it acts again,
        and may leave the others for after its answer (`AbstractAgent.do_learn`)."""

    def end_all_episodes(self) -> None:
        """The agent's episode ended: what waits for more steps of it is complete now."""

    def progress(self) -> dict[str, Any]:
        """What the agent's status shows about the trainer."""

    def paused(self) -> Any:
        """A context during which no learning runs beside the caller (a checkpoint reads the
        learner's weights in it)."""

    def close(self) -> None:
        """Stop learning beside requests (learn_in "background"); a no-op otherwise."""

    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class PacedTrainer:
    """What both trainers share: the pacer that pays their debt (`mistk_rl.rl.pacing`), and,
    with learn_in "background", the split of the policy into the acting one and the copy the
    learner thread trains (the learner is pointed at the copy)."""

    policy: Any
    learner: Learner
    pacer: pacing.Pacer

    def _pace(self, train: Mapping[str, Any]) -> None:
        if train["learn_in"] == "background":
            acting = self.policy
            self.policy = pacing.BackgroundPacer.split(acting)
            self.learner.learn_mode = self.policy.learn_mode
            self.pacer = pacing.BackgroundPacer(self, train, acting, self.policy)
        else:
            self.pacer = pacing.Pacer(self, train)

    def maybe_train(self) -> int:
        with self.pacer.paused():
            self._schedule()
        return self.pacer.pay()

    def updates_due(self, new_steps: int) -> bool:
        if isinstance(self.pacer, pacing.BackgroundPacer):
            return True  # every request may take newer weights from the learner thread
        return self.owed() > 0 or self._falls_due(new_steps)

    def owed(self) -> int:
        """Gradient steps owed now (`pacing.Debtor`)."""
        raise NotImplementedError

    def pay_one(self) -> bool:
        """Run one owed step (`pacing.Debtor`)."""
        raise NotImplementedError

    def _falls_due(self, new_steps: int) -> bool:
        """Whether `_schedule` will owe steps once `new_steps` more are observed."""
        raise NotImplementedError

    def paused(self) -> Any:
        return self.pacer.paused()

    def close(self) -> None:
        self.pacer.close()

    def _schedule(self) -> None:
        """Owe what falls due at the current env step."""
        raise NotImplementedError


class OffPolicyTrainer(PacedTrainer):
    normalizes_samples: ClassVar[bool] = True

    @classmethod
    def default_config(cls) -> dict:
        """The `train` section: the update schedule, and how its steps are paid (pacing)."""
        # a burst of gradient steps is paid in the request it falls due, as SB3 trains it
        # (the time guard still bounds the request). Paid 16 a request over the next 8 env
        # steps, DQN on CartPole took 33,125 env steps to 475 on average against 27,875
        # (the same 20 seeds, one never reaching it counted at the 50,000 budget; SB3 28,750;
        # Mann-Whitney p = .26: the order SB3 trains in is the reason, these figures agree)
        return {
            "learning_starts": 1000,
            "train_freq": 256,
            "gradient_steps": 128,
            **pacing.config(updates_per_request=128),
        }

    @classmethod
    def agent_config(cls, hparams: Mapping[str, Any]) -> dict:
        pacing.check_config(hparams.get("train") or {})
        buffer_type = (hparams.get("buffer") or {}).get("type", "naive")
        if buffer_type not in BUFFERS:
            raise AgentConfigError(
                f"buffer.type {buffer_type!r} is not one of {', '.join(BUFFERS)}"
            )
        return {
            "train": cls.default_config(),
            # learner iterations (one minibatch each) between TensorBoard/CSV rows (0: off)
            "log_every": 100,
            "buffer": {
                "type": buffer_type,
                **BUFFERS[buffer_type].default_config(),
                "replay_buffer_size": 100_000,
            },
            # the replay buffer goes into checkpoints, so a resumed run learns from the same
            # data (measured on CartPole: 7 MB of a 9 MB checkpoint, 0.1 s to save). Off: a
            # resumed run refills it from empty, training on a small buffer at first
            "checkpoint_buffer": True,
            # null, or "board_symmetries": each transition is stored under every symmetry
            # of the game's board (`mistk_rl.games.symmetries`; the game is the one the
            # orchestrator names at registration)
            "augment": None,
        }

    @classmethod
    def from_agent_config(
        cls,
        policy: TrainedPolicy,
        learner: Learner,
        config: dict,
        *,
        seed: Optional[int],
        normalizer: Optional[Normalizer],
        augment: Optional[Augment],
    ) -> OffPolicyTrainer:
        buffer_config = {k: v for k, v in config["buffer"].items() if k != "type"}
        buffer = BUFFERS[config["buffer"]["type"]](buffer_config, seed=seed)
        return cls(
            policy,
            learner,
            buffer,
            config["train"],
            save_buffer=config["checkpoint_buffer"],
            normalizer=normalizer,
            augment=augment,
        )

    def __init__(
        self,
        policy: TrainedPolicy,
        learner: Learner,
        buffer: Buffer,
        config: dict,
        save_buffer: bool = True,
        normalizer: Optional[Normalizer] = None,
        augment: Optional[Augment] = None,
    ) -> None:
        self.policy, self.learner, self.buffer, self.config = policy, learner, buffer, config
        self.normalizer = normalizer
        self.augment = augment
        self.batch_size = policy.config["learn"]["batch_size"]
        self.save_buffer = save_buffer  # the replay buffer goes into `state_dict`
        self._nstep = NStepColumns(policy.config["nstep"], policy.config["learn"]["gamma"])
        self._last_train = 0
        self._owed = 0  # gradient steps due and not run yet
        self._pace({**pacing.config(), **config})

    @property
    def warming_up(self) -> bool:
        return self.learner.env_steps < self.config["learning_starts"]

    def observe(self, entity: str, transition: dict) -> None:
        self.observe_all({entity: transition})

    def observe_all(self, transitions: Mapping[str, dict]) -> None:
        """One env step's transition per entity; what completes an n-step window goes to the
        buffer in one push (one write per column for all entities)."""
        self.observe_steps((transitions,))

    def observe_steps(self, steps: Sequence[Mapping[str, dict]]) -> None:
        """Env steps in time order, each one transition dict per entity (`observe_columns`
        takes them as columns)."""
        keys = [entity for transitions in steps for entity in transitions]
        rows = [t for transitions in steps for t in transitions.values()]
        if rows:
            self.observe_columns(keys, TransitionBatch.from_rows(rows))

    def observe_columns(self, keys: Sequence[Any], batch: TransitionBatch) -> None:
        """Env steps in columns, `keys` each row's entity, in arrival order (an entity's rows
        in time order); what completes n-step windows goes to the buffer in one push, in the
        order step-by-step calls would have pushed it (a batch of 256 steps of one copy is one
        buffer write, not 256: the write costs as much for one row)."""
        with self.pacer.paused():
            self._push(self._nstep.push(keys, batch))

    def end_episode(self, entity: str) -> None:
        """The episode was cut off without a done flag: emit what the n-step window holds."""
        with self.pacer.paused():
            self._push(self._nstep.flush([entity]))

    def end_all_episodes(self) -> None:
        """The agent's episode ended (e.g. a run of several env copies): flush every entity."""
        with self.pacer.paused():
            self._push(self._nstep.flush())

    def progress(self) -> dict[str, Any]:
        """The replay's size, and its statistics (a prioritized one's counters, use and
        staleness of the last sample, beta, ...), and the pacer's debt and guard counter."""
        with self.pacer.paused():
            stats = self.buffer.stats()  # (per replayed step: the valid items counted once)
            return {"bufferSize": stats["count"], "buffer": stats, **self.pacer.progress()}

    def _schedule(self) -> None:
        """`gradient_steps` more owed every `train_freq` env steps, once learning starts;
        a request that brought several `train_freq` of env steps (many env copies, a batch
        of local inference's experience) owes for each."""
        steps, freq = self.learner.env_steps, self.config["train_freq"]
        if self.warming_up or steps - self._last_train < freq:
            return
        if self._last_train < self.config["learning_starts"]:  # the first: at the start
            due, self._last_train = 1, steps
        else:
            due = (steps - self._last_train) // freq
            self._last_train += due * freq
        self._owed += due * self.config["gradient_steps"]

    def _falls_due(self, new_steps: int) -> bool:
        return (
            self.config["gradient_steps"] > 0
            and not self.warming_up
            and self.learner.env_steps - self._last_train >= self.config["train_freq"]
        )

    def owed(self) -> int:
        return self._owed

    def pay_one(self) -> bool:
        """One gradient step on a sampled batch. A buffer that cannot give a batch yet (a
        prioritized one short of its minimum) drops the debt: the steps due now are skipped,
        as they were when updates ran at once."""
        batch = self.buffer.sample_batch(self.batch_size, learner_iter=self.learner.train_iter)
        if batch is None:
            self._owed = 0
            return False
        if self.normalizer is not None:
            batch = self._normalized(batch)
        self._owed -= 1  # first: a checkpoint hook of this step sees it paid
        info = self.learner.train(batch)
        if "priority" in info and self.buffer.takes_priority_feedback:
            assert batch.ids is not None  # (a buffer that takes feedback names its samples)
            self.buffer.update(
                {"replay_unique_id": batch.ids.numpy(), "priority": np.asarray(info["priority"])}
            )
        return True

    def _normalized(self, batch: ReplaySamples) -> ReplaySamples:
        norm = self.normalizer
        assert norm is not None  # (`pay_one` calls it only with one)
        return batch._replace(
            obs=norm.obs(batch.obs),
            next_obs=norm.obs(batch.next_obs),
            reward=norm.reward(batch.reward),
        )

    def state_dict(self) -> dict:
        """The train schedule's position and the steps owed, the n-step windows in progress
        and, with `save_buffer`, the replay buffer (contents, priorities and its RNG)."""
        with self.pacer.paused():
            return {
                "last_train": self._last_train,
                "owed": self._owed,
                "pacer": self.pacer.state_dict(),
                "nstep": self._nstep.pending(),
                "buffer": self.buffer.state_dict() if self.save_buffer else None,
            }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`; its n-step windows end as cut episodes (module doc)."""
        with self.pacer.paused():
            self._load_state_dict(state)
        if isinstance(self.pacer, pacing.BackgroundPacer):
            self.pacer.publish_now()

    def _load_state_dict(self, state: dict) -> None:
        self._last_train = int(state["last_train"])
        self._owed = int(state.get("owed", 0))  # (checkpoints from before the debt: none)
        self.pacer.load_state_dict(state.get("pacer"))
        if state["buffer"] is not None:
            self.buffer.load_state_dict(state["buffer"])
        self._nstep.clear()
        for entity, steps in state["nstep"].items():  # fewer than n steps, none ending an
            # episode: nothing is emitted until the cut
            self._nstep.push([entity] * len(steps), TransitionBatch.from_rows(steps))
            self.end_episode(entity)

    def _push(self, items: Optional[TransitionBatch]) -> None:
        if items is None:
            return
        if self.augment is not None:  # (a game's symmetries: a transition at a time)
            self.buffer.push(
                [image for t in items.rows() for image in self.augment(t)],
                collect_iter=self.learner.train_iter,
            )
        else:
            self.buffer.push(items, collect_iter=self.learner.train_iter)


class OnPolicyTrainer(PacedTrainer):
    normalizes_samples: ClassVar[bool] = False  # the rollout keeps what the policy acted on

    @classmethod
    def default_config(cls) -> dict:
        """The `train` section: transitions per rollout, over all entities, and how the
        update's minibatch steps are paid (pacing)."""
        return {"n_steps": 256, **pacing.config()}

    @classmethod
    def agent_config(cls, hparams: Mapping[str, Any]) -> dict:
        pacing.check_config(hparams.get("train") or {})
        # learner iterations (one whole rollout each) between TensorBoard/CSV rows (0: off)
        return {"train": cls.default_config(), "log_every": 1}

    @classmethod
    def from_agent_config(
        cls,
        policy: ValuePolicy,
        learner: Learner,
        config: dict,
        *,
        seed: Optional[int],
        normalizer: Optional[Normalizer],
        augment: Optional[Augment],
    ) -> OnPolicyTrainer:
        """(`normalizer`: the agent normalises what the rollout stores; `augment`: none, a
        transition's log-prob is its own observation's; the config has no key for it.)"""
        return cls(policy, learner, config["train"])

    def __init__(self, policy: ValuePolicy, learner: Learner, config: dict) -> None:
        self.policy, self.learner, self.config = policy, learner, config
        self._chunks: list[tuple[list[Any], TransitionBatch]] = []  # the rollout so far
        self._count = 0
        # completed rollouts' updates, frozen, the first one in progress: acting between
        # their steps is on-policy enough, as each transition keeps its acting log-prob
        self._plans: list[UpdatePlan] = []
        self._pace({**pacing.config(), **config})

    warming_up = False

    def observe(self, entity: str, transition: dict) -> None:
        self.observe_all({entity: transition})

    def observe_all(self, transitions: Mapping[str, dict]) -> None:
        """One env step's transition per entity."""
        self.observe_steps((transitions,))

    def observe_steps(self, steps: Sequence[Mapping[str, dict]]) -> None:
        """Env steps in time order, each one transition per entity."""
        keys = [entity for transitions in steps for entity in transitions]
        rows = [t for transitions in steps for t in transitions.values()]
        if rows:
            self.observe_columns(keys, TransitionBatch.from_rows(rows))

    def observe_columns(self, keys: Sequence[Any], batch: TransitionBatch) -> None:
        """Env steps in columns, `keys` each row's entity (an entity's rows in time order):
        kept as they came; the rollout sorts them by entity when it is complete."""
        with self.pacer.paused():
            self._chunks.append((list(keys), batch))
            self._count += len(batch)

    def rollout(self) -> dict[Any, TransitionBatch]:
        """The rollout so far: each entity's steps in time order, entities in first-seen
        order."""
        if not self._chunks:
            return {}
        keys = [key for chunk_keys, _ in self._chunks for key in chunk_keys]
        batch = TransitionBatch.concat([chunk for _, chunk in self._chunks])
        rank = {key: i for i, key in enumerate(dict.fromkeys(keys))}
        entity = np.fromiter((rank[k] for k in keys), np.int64, len(keys))
        order = np.lexsort((np.arange(len(keys)), entity))
        bounds = np.flatnonzero(np.diff(entity[order])) + 1
        return {key: batch[rows] for key, rows in zip(rank, np.split(order, bounds))}

    def end_all_episodes(self) -> None:
        """Nothing to do: transitions carry their own terminated/truncated flags, and a
        rollout bootstraps from the value of its last next_obs."""

    def progress(self) -> dict[str, Any]:
        """The pacer's debt (minibatch steps of the frozen updates) and guard counter."""
        return self.pacer.progress()

    def state_dict(self) -> dict:
        """The rollout collected so far, and the updates frozen and not yet fully run, with
        how far each got (its batch, rows and the steps' stats so far)."""
        with self.pacer.paused():
            return {
                "rollout": {entity: steps.rows() for entity, steps in self.rollout().items()},
                "count": self._count,
                "pacer": self.pacer.state_dict(),
                # (a checkpoint hook runs after a plan's last step, before it is let go)
                "plans": [plan.state_dict() for plan in self._plans if plan.left],
            }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`; each entity's episode in progress ends as a cut one."""
        with self.pacer.paused():
            self._chunks = [
                (
                    [entity] * len(steps),
                    TransitionBatch.from_rows([*steps[:-1], {**steps[-1], "truncated": True}]),
                )
                for entity, steps in state["rollout"].items()
                if steps
            ]
            self._count = int(state["count"])
            self._plans = [
                self.learner.restore_plan(plan, RolloutSamples) for plan in state.get("plans", [])
            ]
            self.pacer.load_state_dict(state.get("pacer"))
        if isinstance(self.pacer, pacing.BackgroundPacer):
            self.pacer.publish_now()

    def _schedule(self) -> None:
        """A complete rollout becomes an update owed: GAE with the weights of now, and its
        minibatch steps drawn now, as a one-shot update would have drawn them."""
        if self._count < self.config["n_steps"]:
            return
        self._plans.append(self.learner.plan(self._rollout_batch()))
        self._chunks.clear()
        self._count = 0

    def _falls_due(self, new_steps: int) -> bool:
        return self._count + new_steps >= self.config["n_steps"]

    def owed(self) -> int:
        return sum(plan.left for plan in self._plans)

    def pay_one(self) -> bool:
        self.learner.train_step(self._plans[0])
        if not self._plans[0].left:
            self._plans.pop(0)
        return True

    def _rollout_batch(self) -> RolloutSamples:
        """Each entity's steps with their GAE targets, the entities one after another."""
        learn = self.policy.config["learn"]
        pieces = []
        for steps in self.rollout().values():
            batch = {key: to_batch_tensor(column) for key, column in steps.columns.items()}
            # V(s) and V(s') both of the weights of now: the values recorded when acting may
            # be of weights an update paid over the first requests of this rollout changed
            # since (pacing), and a delta mixing two value functions is noise, large where
            # returns are unnormalised (Acrobot: a seed stalled for 200k steps)
            values = self.policy.value(batch["obs"]).numpy()
            next_values = self.policy.value(batch["next_obs"]).numpy()
            terminated = batch["terminated"].numpy().astype(np.float32)
            dones = np.maximum(terminated, batch["truncated"].numpy().astype(np.float32))
            advantage, returns = gae(
                batch["reward"].numpy().astype(np.float32),
                values,
                next_values,
                terminated,
                dones,
                learn["gamma"],
                learn["gae_lambda"],
            )
            pieces.append(
                RolloutSamples(
                    obs=batch["obs"],
                    action=batch["action"],
                    log_prob=batch["log_prob"],
                    value=torch.as_tensor(values, dtype=torch.float32),
                    advantage=torch.as_tensor(advantage, dtype=torch.float32),
                    returns=torch.as_tensor(returns, dtype=torch.float32),
                    action_mask=batch.get("action_mask"),
                )
            )
        rows: dict[str, Any] = {  # (Batch, tensor or None by field)
            field: None
            if getattr(pieces[0], field) is None
            else concat([getattr(piece, field) for piece in pieces])
            for field in RolloutSamples._fields
            if field != "env_steps"
        }
        return RolloutSamples(**rows, env_steps=self.learner.env_steps)
