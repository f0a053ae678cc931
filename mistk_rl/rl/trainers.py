"""Trainers: what to do with transitions as they stream in from the environment.

An agent service does not own its environment loop: transitions arrive one replayAction at a
time, for one or more entities. A trainer turns that stream into learner updates.

- `OffPolicyTrainer` (DQN): per-entity n-step accumulation into a replay buffer, then
  `gradient_steps` updates every `train_freq` env steps once `learning_starts` is reached,
  feeding new priorities back to a prioritized buffer. With a `Normalizer`, the buffer holds
  raw observations and rewards and each sampled batch is normalised with the statistics of
  the moment (SB3's off-policy handling of VecNormalize; an n-step reward, a discounted sum,
  is scaled as a whole, and clipped as a whole).
- `OnPolicyTrainer` (PPO): per-entity rollouts; every `n_steps` transitions, GAE and one
  learner call on the whole rollout.

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

from typing import Any, Callable, ClassVar, Mapping, Optional, Protocol

import numpy as np
import torch

from mistk_rl.rl.config import ConfigError
from mistk_rl.rl.data.buffers import BUFFERS
from mistk_rl.rl.data.collate import Batch, concat, default_collate
from mistk_rl.rl.data.returns import NStepAccumulator, gae
from mistk_rl.rl.data.samples import ReplaySamples, RolloutSamples
from mistk_rl.rl.learner import Learner
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

    def push(self, data: list[dict], collect_iter: int = 0) -> bool: ...
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
    def from_agent_config(cls, policy: TrainedPolicy, learner: Learner, config: dict, *,
                          seed: Optional[int], normalizer: Optional[Normalizer],
                          augment: Optional[Augment]) -> Trainer:
        """Built from the agent's merged config."""

    @property
    def warming_up(self) -> bool:
        """Act with a uniformly random policy for now (a replay's first data)."""

    def observe_all(self, transitions: Mapping[str, dict]) -> None:
        """One env step's transition per entity."""

    def maybe_train(self) -> int:
        """Run the updates due now; how many ran."""

    def end_all_episodes(self) -> None:
        """The agent's episode ended: what waits for more steps of it is complete now."""

    def progress(self) -> dict[str, Any]:
        """What the agent's status shows about the trainer."""

    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class OffPolicyTrainer:
    normalizes_samples = True

    @classmethod
    def default_config(cls) -> dict:
        """The `train` section: the update schedule."""
        return {"learning_starts": 1000, "train_freq": 256, "gradient_steps": 128}

    @classmethod
    def agent_config(cls, hparams: Mapping[str, Any]) -> dict:
        buffer_type = (hparams.get("buffer") or {}).get("type", "naive")
        if buffer_type not in BUFFERS:
            raise ConfigError(f"buffer.type {buffer_type!r} is not one of {', '.join(BUFFERS)}")
        return {
            "train": cls.default_config(),
            # learner iterations (one minibatch each) between TensorBoard/CSV rows (0: off)
            "log_every": 100,
            "buffer": {"type": buffer_type, **BUFFERS[buffer_type].default_config(),
                       "replay_buffer_size": 100_000},
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
    def from_agent_config(cls, policy: TrainedPolicy, learner: Learner, config: dict, *,
                          seed: Optional[int], normalizer: Optional[Normalizer],
                          augment: Optional[Augment]) -> OffPolicyTrainer:
        buffer_config = {k: v for k, v in config["buffer"].items() if k != "type"}
        buffer = BUFFERS[config["buffer"]["type"]](buffer_config, seed=seed)
        return cls(policy, learner, buffer, config["train"],
                   save_buffer=config["checkpoint_buffer"], normalizer=normalizer,
                   augment=augment)

    def __init__(self, policy: TrainedPolicy, learner: Learner, buffer: Buffer, config: dict,
                 save_buffer: bool = True, normalizer: Optional[Normalizer] = None,
                 augment: Optional[Augment] = None) -> None:
        self.policy, self.learner, self.buffer, self.config = policy, learner, buffer, config
        self.normalizer = normalizer
        self.augment = augment
        self.batch_size = policy.config["learn"]["batch_size"]
        self.save_buffer = save_buffer  # the replay buffer goes into `state_dict`
        self._nstep: dict[str, NStepAccumulator] = {}
        self._last_train = 0

    @property
    def warming_up(self) -> bool:
        return self.learner.env_steps < self.config["learning_starts"]

    def observe(self, entity: str, transition: dict) -> None:
        self.observe_all({entity: transition})

    def observe_all(self, transitions: Mapping[str, dict]) -> None:
        """One env step's transition per entity; what completes an n-step window goes to the
        buffer in one push (one write per column for all entities)."""
        done: list[dict] = []
        for entity, transition in transitions.items():
            done += self._accumulator(entity).push(transition)
        self._push(done)

    def end_episode(self, entity: str) -> None:
        """The episode was cut off without a done flag: emit what the n-step window holds."""
        if entity in self._nstep:
            self._push(self._nstep[entity].flush())

    def end_all_episodes(self) -> None:
        """The agent's episode ended (e.g. a run of several env copies): flush every entity."""
        for entity in list(self._nstep):
            self.end_episode(entity)

    def progress(self) -> dict[str, Any]:
        """The replay's size, and its statistics (a prioritized one's counters, use and
        staleness of the last sample, beta, ...)."""
        stats = self.buffer.stats()  # (per replayed step: the valid items are counted once)
        return {"bufferSize": stats["count"], "buffer": stats}

    def maybe_train(self) -> int:
        """Run the updates due at the current env step; returns how many ran."""
        steps = self.learner.env_steps
        if self.warming_up or steps - self._last_train < self.config["train_freq"]:
            return 0
        self._last_train = steps
        done = 0
        for _ in range(self.config["gradient_steps"]):
            batch = self.buffer.sample_batch(self.batch_size, learner_iter=self.learner.train_iter)
            if batch is None:
                break
            if self.normalizer is not None:
                batch = self._normalized(batch)
            info = self.learner.train(batch)
            if "priority" in info and self.buffer.takes_priority_feedback:
                self.buffer.update({"replay_unique_id": batch.ids.numpy(),
                                    "priority": np.asarray(info["priority"])})
            done += 1
        return done

    def _normalized(self, batch: ReplaySamples) -> ReplaySamples:
        norm = self.normalizer
        return batch._replace(obs=norm.obs(batch.obs), next_obs=norm.obs(batch.next_obs),
                              reward=norm.reward(batch.reward))

    def state_dict(self) -> dict:
        """The train schedule's position, the n-step windows in progress and, with
        `save_buffer`, the replay buffer (contents, priorities and its RNG)."""
        return {"last_train": self._last_train,
                "nstep": {entity: acc.pending() for entity, acc in self._nstep.items()
                          if len(acc)},
                "buffer": self.buffer.state_dict() if self.save_buffer else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`; its n-step windows end as cut episodes (module doc)."""
        self._last_train = int(state["last_train"])
        if state["buffer"] is not None:
            self.buffer.load_state_dict(state["buffer"])
        self._nstep.clear()
        for entity, steps in state["nstep"].items():
            acc = self._accumulator(entity)
            for step in steps:  # fewer than n steps, none ending an episode: nothing emitted
                acc.push(step)
            self.end_episode(entity)

    def _accumulator(self, entity: str) -> NStepAccumulator:
        acc = self._nstep.get(entity)
        if acc is None:
            acc = self._nstep[entity] = NStepAccumulator(
                self.policy.config["nstep"], self.policy.config["learn"]["gamma"])
        return acc

    def _push(self, transitions: list[dict]) -> None:
        if self.augment is not None:
            transitions = [image for t in transitions for image in self.augment(t)]
        if transitions:
            self.buffer.push(transitions, collect_iter=self.learner.train_iter)


class OnPolicyTrainer:
    normalizes_samples = False  # the rollout keeps what the policy acted on

    @classmethod
    def default_config(cls) -> dict:
        """The `train` section: transitions per rollout, over all entities."""
        return {"n_steps": 256}

    @classmethod
    def agent_config(cls, hparams: Mapping[str, Any]) -> dict:
        # learner iterations (one whole rollout each) between TensorBoard/CSV rows (0: off)
        return {"train": cls.default_config(), "log_every": 1}

    @classmethod
    def from_agent_config(cls, policy: ValuePolicy, learner: Learner, config: dict, *,
                          seed: Optional[int], normalizer: Optional[Normalizer],
                          augment: Optional[Augment]) -> OnPolicyTrainer:
        """(`normalizer`: the agent normalises what the rollout stores; `augment`: none, a
        transition's log-prob is its own observation's; the config has no key for it.)"""
        return cls(policy, learner, config["train"])

    def __init__(self, policy: ValuePolicy, learner: Learner, config: dict) -> None:
        self.policy, self.learner, self.config = policy, learner, config
        self._rollout: dict[str, list[dict]] = {}
        self._count = 0

    warming_up = False

    def observe(self, entity: str, transition: dict) -> None:
        self._rollout.setdefault(entity, []).append(transition)
        self._count += 1

    def observe_all(self, transitions: Mapping[str, dict]) -> None:
        """One env step's transition per entity."""
        for entity, transition in transitions.items():
            self.observe(entity, transition)

    def end_all_episodes(self) -> None:
        """Nothing to do: transitions carry their own terminated/truncated flags, and a
        rollout bootstraps from the value of its last next_obs."""

    def progress(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict:
        """The rollout collected so far (it was collected with the current weights)."""
        return {"rollout": {entity: list(steps) for entity, steps in self._rollout.items()},
                "count": self._count}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`; each entity's episode in progress ends as a cut one."""
        self._rollout = {entity: [*steps[:-1], {**steps[-1], "truncated": True}]
                         for entity, steps in state["rollout"].items() if steps}
        self._count = int(state["count"])

    def maybe_train(self) -> int:
        if self._count < self.config["n_steps"]:
            return 0
        self.learner.train(self._rollout_batch())
        self._rollout.clear()
        self._count = 0
        return 1

    def _rollout_batch(self) -> RolloutSamples:
        """Each entity's steps with their GAE targets, the entities one after another."""
        learn = self.policy.config["learn"]
        pieces = []
        for steps in self._rollout.values():
            batch = default_collate(steps)
            next_values = self.policy.value(batch["next_obs"]).numpy()
            terminated = batch["terminated"].numpy().astype(np.float32)
            dones = np.maximum(terminated, batch["truncated"].numpy().astype(np.float32))
            advantage, returns = gae(batch["reward"].numpy().astype(np.float32),
                                     batch["value"].numpy().astype(np.float32), next_values,
                                     terminated, dones, learn["gamma"], learn["gae_lambda"])
            pieces.append(RolloutSamples(
                obs=batch["obs"], action=batch["action"], log_prob=batch["log_prob"],
                value=batch["value"], advantage=torch.as_tensor(advantage, dtype=torch.float32),
                returns=torch.as_tensor(returns, dtype=torch.float32),
                action_mask=batch.get("action_mask")))
        rows = {field: None if getattr(pieces[0], field) is None
                else concat([getattr(piece, field) for piece in pieces])
                for field in RolloutSamples._fields if field != "env_steps"}
        return RolloutSamples(**rows, env_steps=self.learner.env_steps)
