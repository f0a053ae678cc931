"""`PolicyAgent`: an agent service around a `Policy`, a `Learner` and a trainer.

How the MISTK calls map onto RL:

- initialize(hyperparameters): the agent config (seed, policy, train, buffer, logging),
  deep-merged over the defaults; an unknown key is a 400 naming it. The merged config is
  written to ``<data dir>/config.yaml``.
- buildModel(path): load a checkpoint (``weights_only``) and continue from it, or build fresh
  once the spaces are known (at registration, or now if modelProperties carries them).
- episodeStarted(mode): "collect" explores and learns, "eval" acts greedily and never learns.
- getAction / step / stepColumns: one batched forward pass for all rows (`do_act`); the
  service keeps what the model said under each row's step id.
- the outcomes of those steps (stepColumns, or replayAction / step's replay): transitions
  assembled by the service from what it kept, into the trainer (`do_learn`), which owes
  updates on its schedule and pays a bounded number of gradient steps per request, or runs
  them on a learner thread (`train.learn_in`, `mistk_rl/rl/pacing.py`): learning never holds
  a request for long.
- saveModel(path): everything training needs to continue (see `_checkpoint_state`), written
  atomically; the periodic checkpoint (`checkpoint_every`) writes the same.

One update, hop by hop (the agent does not own the env loop, so the steps live in several
files): stepColumns -> `mistk_rl.service.steps` (the kept rows) -> `do_learn` -> the
policy's `collect_mode.process_transition` (a transition dict per entity) -> its
`trainer_cls` (`mistk_rl/rl/trainers.py`):
- DQN, `OffPolicyTrainer`: n-step windows (`data/returns.py`) -> `buffer.push`; on schedule
  `buffer.sample_batch` -> `ReplaySamples` (`data/samples.py`) -> `Learner.train` ->
  `DQNPolicy._forward_learn` -> new priorities -> `buffer.update`;
- PPO, `OnPolicyTrainer`: the rollout; every `n_steps`, GAE -> `RolloutSamples` ->
  `Learner.plan` -> `PPOPolicy._plan_update` (the minibatch steps), then over the next
  requests `Learner.train_step` -> `PPOPolicy._update_step`.

Normalisation (`normalize` in the config, `mistk_rl.rl.normalize`) happens here, at the
service boundary, so the policies never know about it. The policy always acts on normalised
observations; the statistics move only in collect mode (observations at getAction, returns at
replayAction). What is stored follows SB3:
- a rollout (PPO) stores the normalised observations the policy acted on and the
  scaled rewards. The importance ratio compares log-probs of the same input, and a rollout is
  used once, right after it was collected, so its normalisation is never stale.
- a replay (DQN): the buffer stores raw observations and rewards; the trainer
  normalises each sampled batch with the current statistics. A transition lives through many
  statistics updates: normalised once at storage it would mix scales across the buffer, and
  the checkpointed buffer stays valid whatever the statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np
import torch
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.agent import (
    AbstractAgent,
    Acted,
    Acting,
    EpisodeInfo,
    PolicyDescription,
    Transitions,
    rounds,
)
from mistk_rl.framework.implementation import PROGRESS_EVERY_S, Metric
from mistk_rl.games.symmetries import GAMES, BoardSymmetries, symmetries_for
from mistk_rl.rl.actor import Actor
from mistk_rl.rl.actor import weights as actor_weights
from mistk_rl.rl.config import AgentConfigError, deep_merge, save_config
from mistk_rl.rl.data.transition_batch import TransitionBatch
from mistk_rl.rl.device import resolve_device
from mistk_rl.rl.learner import (
    CheckpointHook,
    Hook,
    Learner,
    LogHook,
    load_checkpoint,
    save_checkpoint,
)
from mistk_rl.rl.normalize import Normalizer
from mistk_rl.rl.policies.base import Policy
from mistk_rl.rl.policies.random import RandomPolicy
from mistk_rl.rl.trainers import Trainer
from mistk_rl.spaces import space_from_dict, space_from_request, space_to_dict

CHECKPOINT_FORMAT = 2  # 2: + trainer and rng (format 1 restores weights and counters)


class _Model(NamedTuple):
    """What `_build` makes and every call after it uses: `_require_model` hands it over whole,
    so the step path checks once that there is a model, not once per piece."""

    policy: Policy
    learner: Learner
    trainer: Trainer
    actor: Actor


class PolicyAgent(AbstractAgent):
    """Subclasses set `policy_cls` (and may override `default_config`)."""

    policy_cls: type[Policy]
    local_inference = True

    # ---- config ------------------------------------------------------------------------
    @classmethod
    def default_config(cls, hparams: Optional[Mapping[str, Any]] = None) -> dict:
        """The defaults; the policy's trainer adds its sections (`train`, `log_every`, and
        for a replay `buffer`, whose defaults follow `hparams`' buffer.type, ...)."""
        return {
            "seed": None,
            "policy": cls.policy_cls.default_config(),
            **cls.policy_cls.trainer_cls.agent_config(hparams or {}),
            # learner iterations between checkpoints to checkpoints/latest.pt; 0: off. The
            # harness's training loop saves its own at each evaluation (training.checkpoints)
            "checkpoint_every": 0,
            # torch's intra-op threads in this service. Small policies gain nothing from more
            # than one, and extra threads spin against the orchestrator and env processes on
            # the same cores (measured: PPO's step 30% slower with 2 on 2 cores, and 8x slower
            # when the cores are busy). null: torch's default (one per core)
            "torch_threads": 1,
            # where the model learns and acts: auto (CUDA when torch sees a GPU, as a service
            # placed with gpus: 1 does), cpu or cuda (refused where there is none). Buffers,
            # generators and local-inference copies stay on the CPU (`mistk_rl.rl.device`)
            "device": "auto",
            # observation and reward normalisation (SB3's VecNormalize; module doc): off by
            # default. gamma: the discount of the return whose std scales rewards (null: the
            # policy's learn.gamma)
            "normalize": {
                "obs": False,
                "reward": False,
                "clip_obs": 10.0,
                "clip_reward": 10.0,
                "gamma": None,
                "epsilon": 1e-8,
            },
        }

    @classmethod
    def compile_config(cls, hparams: Optional[dict]) -> dict:
        return deep_merge(cls.default_config(hparams), hparams)

    # ---- lifecycle hooks -----------------------------------------------------------------
    def __init__(self) -> None:
        super().__init__()
        self.config: dict[str, Any] = {}
        self.hparams: dict[str, Any] = {}  # as given: re-applied over a checkpoint's config
        self.properties: dict[str, Any] = {}
        self._model: Optional[_Model] = None
        self.warmup: Optional[RandomPolicy] = None
        self.normalizer: Optional[Normalizer] = None
        self.mode = "collect"
        self.augment: Optional[BoardSymmetries] = None  # set at registration

    # ---- the model's pieces, for readers outside (None until it is built) ----------------
    @property
    def policy(self) -> Optional[Policy]:
        return None if self._model is None else self._model.policy

    @property
    def learner(self) -> Optional[Learner]:
        return None if self._model is None else self._model.learner

    @property
    def trainer(self) -> Optional[Trainer]:
        return None if self._model is None else self._model.trainer

    @property
    def actor(self) -> Optional[Actor]:
        return None if self._model is None else self._model.actor

    def validate_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        try:
            config = self.compile_config(hparams)
            resolve_device(config["device"])
        except AgentConfigError as exc:
            raise InvalidRequest(f"hyperparameters: {exc}") from exc
        threads = config["torch_threads"]
        if threads is not None and (type(threads) is not int or threads < 1):
            raise InvalidRequest(
                f"hyperparameters: torch_threads must be a positive integer "
                f"or null, not {threads!r}"
            )
        if "observationSpace" in props and "actionSpace" in props:  # built at buildModel
            obs_space, act_space = (
                space_from_request(props[k], self.limits, f"modelProperties.{k}")
                for k in ("observationSpace", "actionSpace")
            )
            self._check_model(config, obs_space, act_space)

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
        if observation_space is None or action_space is None:
            raise InvalidRequest(
                f"{type(self).__name__} needs observationSpace and actionSpace at registration"
            )
        if self._model is None:
            self._check_model(self.config, observation_space, action_space)
            return
        built = (
            space_to_dict(self._model.policy.observation_space),
            space_to_dict(self._model.policy.action_space),
        )
        given = (space_to_dict(observation_space), space_to_dict(action_space))
        if built != given:
            raise InvalidRequest(
                f"the model was built for spaces {built}, the orchestrator offers {given}"
            )

    def validate_registration_properties(self, properties: dict[str, Any]) -> None:
        augment = self.config.get("augment")
        if augment is None:
            return
        if augment != "board_symmetries":
            raise InvalidRequest(
                f"hyperparameters: augment must be null or 'board_symmetries', not {augment!r}"
            )
        if symmetries_for(properties.get("game")) is None:
            raise InvalidRequest(
                f"augment board_symmetries: no symmetries are known for "
                f"{properties.get('game') or 'an env that names no game'} "
                f"(known: {', '.join(GAMES)})"
            )

    def _check_model(self, config: dict, obs_space: spaces.Space, act_space: spaces.Space) -> None:
        """Refuse spaces the policy cannot act in, or whose model would be over the
        max_model_params limit, before anything is allocated: the policy is built on torch's
        meta device (shapes only, no memory, no random numbers drawn)."""
        try:
            with torch.device("meta"):
                policy = self.policy_cls(config["policy"], obs_space, act_space, seed=None)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(
                f"{type(self).__name__} cannot act in these spaces: {exc}"
            ) from exc
        if config["normalize"]["obs"] and not isinstance(obs_space, spaces.Box):
            raise InvalidRequest(
                f"hyperparameters: normalize.obs needs a Box observation space, not {obs_space}"
            )
        params = {
            id(p): p.numel()
            for module in vars(policy).values()
            if isinstance(module, torch.nn.Module)
            for p in module.parameters()
        }
        self.limits.check(
            "max_model_params",
            sum(params.values()),
            "the parameter count of the model these spaces need",
        )

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        self.config = self.compile_config(hparams)
        self.hparams, self.properties = dict(hparams), dict(props)
        if self.config["torch_threads"]:
            torch.set_num_threads(self.config["torch_threads"])
        save_config(self.config, self.data_dir / "config.yaml")

    def do_build_model(self, path: Optional[Path]) -> None:
        self._drop_model()
        if path is not None:
            checkpoint = load_checkpoint(path)
            expected = type(self).__name__
            if checkpoint.get("agent") != expected:
                raise ValueError(
                    f"{path.name} is a {checkpoint.get('agent')} checkpoint, not a {expected} one"
                )
            if "learner" not in checkpoint:
                raise ValueError(
                    f"{path.name} holds no learner state (a periodic checkpoint "
                    "written before format 2 cannot be loaded)"
                )
            # the checkpoint fixes the architecture; what initialize gave explicitly wins
            saved = checkpoint["config"]
            # checkpoints from before normalisation existed: their runs had it off
            saved.setdefault("normalize", self.default_config()["normalize"])
            # where the model runs is this service's choice (initialize's), not the saver's:
            # a checkpoint trained on a GPU loads on a CPU-only node, and the other way round
            saved["device"] = self.config["device"]
            self.config = deep_merge(saved, self.hparams)
            save_config(self.config, self.data_dir / "config.yaml")
            obs_space, act_space = (
                space_from_dict(checkpoint["spaces"][k]) for k in ("observation", "action")
            )
            self._build(obs_space, act_space, checkpoint)
        elif "observationSpace" in self.properties and "actionSpace" in self.properties:
            self._build(
                space_from_dict(self.properties["observationSpace"]),
                space_from_dict(self.properties["actionSpace"]),
            )

    def do_agent_registered(self, config: dict[str, Any]) -> None:
        if self.config.get("augment"):
            self.augment = symmetries_for(config.get("properties", {}).get("game"))
        if self._model is None:  # (validate_registration checked the spaces)
            obs_space, act_space = self.observation_space, self.action_space
            assert obs_space is not None and act_space is not None  # (registration has them)
            self._build(obs_space, act_space)

    def validate_episode_start(self, episode: EpisodeInfo) -> None:
        if episode.epsilon is not None and (
            self.policy is None or self.policy.exploration(0) is None
        ):
            raise InvalidRequest(
                f"epsilon: {type(self.policy).__name__} has no epsilon-greedy exploration to set"
            )

    def do_episode_started(self, episode: EpisodeInfo) -> None:
        policy = self._require_model().policy
        self.mode = episode.mode
        policy.epsilon_override = episode.epsilon  # (None for policies without one)
        if self.normalizer is not None:
            self.normalizer.end_episodes()
        (policy.eval_mode if self.mode == "eval" else policy.collect_mode).reset()
        self.update_status({"mode": self.mode})

    def do_act(self, batch: Acting) -> Acted:
        """One forward pass for all rows. In collect mode the extras keep what the model
        said (the sampled action, log-prob, value; with obs normalisation for a rollout, the
        normalised observation it acted on): the service keeps them under each row's step
        id and hands them back with the transition (`do_learn`)."""
        model = self._require_model()
        actions, extras = model.actor.act(
            batch.obs,
            batch.action_mask,
            mode=self.mode,
            env_steps=model.learner.env_steps,
            warming_up=model.trainer.warming_up,
        )
        return Acted(actions, extras)

    def do_learn(self, transitions: Transitions) -> Optional[Callable[[], None]]:
        """Count the env steps now: exploration and the warm-up read the count when the
        next rows are acted on. If updates are due (or owed), learn now too, so the next
        rows are acted on with their weights, as always; otherwise storing the transitions
        (`_learn`) changes nothing acting reads and may wait for the step's answer."""
        model = self._require_model()
        if self.mode == "eval":
            return None  # evaluation episodes never train the agent
        model.learner.env_steps += len(transitions)
        if model.trainer.updates_due(len(transitions)):
            self._learn(transitions)
            return None
        return partial(self._learn, transitions)

    def _learn(self, transitions: Transitions) -> None:
        """Store the transitions, in columns, and train if due. Rows of one entity (local
        inference's batches) go in order, one round each (the k-th step of every entity in
        round k): what a learner stepping once per entity at a time would see."""
        model = self._require_model()
        keys = transitions.names if transitions.names is not None else transitions.envs.tolist()
        sizes = [len(keys)]
        if len(set(keys)) < len(keys):
            groups = rounds(keys)
            order = np.concatenate(groups)
            transitions, keys, sizes = (
                transitions.take(order),
                [keys[i] for i in order],
                [len(g) for g in groups],
            )
        model.trainer.observe_columns(keys, self._stored(model, transitions, keys, sizes))
        model.trainer.maybe_train()
        self.update_status(self.progress(), every_s=PROGRESS_EVERY_S)

    def _stored(
        self, model: _Model, transitions: Transitions, keys: list, sizes: list[int]
    ) -> TransitionBatch:
        """The transitions as the trainer takes them: what the policy keeps of the model's
        outputs; a rollout's obs and rewards normalised (`sizes`: the rounds, whose reward
        statistics move one after another), a replay buffer's raw (its trainer normalises
        samples: module doc). Nothing is stored if the policy refuses a row."""
        matched = transitions.matched
        outputs = transitions.extras if matched is None or matched.all() else {}
        steps = TransitionBatch(
            {
                "obs": outputs.get("obs", transitions.obs),  # (what the model acted on)
                "action": outputs.get("action", transitions.actions),
                "reward": transitions.rewards.astype(np.float64, copy=False),
                "next_obs": transitions.next_obs,
                "terminated": transitions.terminated,
                "truncated": transitions.truncated,
            }
        )
        if model.policy.masks_next_actions and transitions.next_action_mask is not None:
            steps.columns["next_action_mask"] = np.asarray(transitions.next_action_mask, bool)
        try:
            stored = model.policy.process_columns(
                steps, {k: v for k, v in outputs.items() if k != "obs"}
            )
        except ValueError as exc:
            row = 0 if matched is None else int(np.argmax(~matched))
            raise ValueError(
                f"replayAction for {keys[row]!r} with action {transitions.actions[row]}: {exc}"
            ) from exc
        if self.normalizer is not None:
            rollout = not model.trainer.normalizes_samples
            self._normalize(stored, transitions, keys, sizes, rollout, "obs" not in outputs)
        return stored

    def _normalize(
        self,
        stored: TransitionBatch,
        transitions: Transitions,
        keys: list,
        sizes: list[int],
        rollout: bool,
        raw_obs: bool,
    ) -> None:
        """Fold the rewards into the return statistics, a round at a time; for a rollout,
        scale each round's rewards with the statistics of then and normalise the obs."""
        normalizer = self.normalizer
        assert normalizer is not None
        rewards = stored.columns["reward"]
        dones = transitions.terminated | transitions.truncated
        scaled = rewards.copy()
        start = 0
        for size in sizes:
            part = slice(start, start + size)
            normalizer.update_rewards(
                dict(zip(keys[part], rewards[part].tolist())),
                dict(zip(keys[part], dones[part].tolist())),
            )
            if rollout:
                scaled[part] = normalizer.reward(rewards[part])
            start += size
        if rollout:
            stored.columns["reward"] = scaled
            stored.columns["next_obs"] = normalizer.obs(stored.columns["next_obs"])
            if raw_obs:
                stored.columns["obs"] = normalizer.obs(stored.columns["obs"])

    def do_policy_copy(self, weights: bool) -> PolicyDescription:
        """The policy's config and, when asked, the acting weights (local inference). An
        agent that normalises observations offers none: a copy would act on statistics
        that move only here."""
        policy, learner, trainer, _ = self._require_model()
        if self.normalizer is not None and self.normalizer.norm_obs:
            raise InvalidRequest(
                "local inference: this agent normalises observations "
                "(normalize.obs), which a copy cannot follow; turn one off"
            )
        with trainer.paused():  # (learn_in background: no step while weights are read)
            return PolicyDescription(
                policy=type(policy).__name__,
                config=policy.config,
                observation_space=space_to_dict(policy.observation_space),
                action_space=space_to_dict(policy.action_space),
                seed=self.config["seed"],
                env_steps=learner.env_steps,
                warmup_until=(
                    self.config["train"].get("learning_starts", 0) if self.warmup is not None else 0
                ),
                version=learner.train_iter,
                extras=policy.transition_extras(),
                optional_extras=sorted(policy.optional_extras),
                weights=actor_weights(policy) if weights else None,
            )

    def do_episode_stopped(self) -> None:
        if self._model is not None and self.mode == "collect":
            self._model.trainer.end_all_episodes()
        if self.normalizer is not None:
            self.normalizer.end_episodes()

    def do_save_model(self, path: Path) -> None:
        self._require_model()
        save_checkpoint(self._checkpoint_state(), path)

    def do_reset(self, unload_model: bool) -> None:
        if unload_model:
            self._drop_model()
            self.config = {}

    def do_terminate(self) -> None:
        self._drop_model()

    # ---- pieces --------------------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        """What the status payload shows about training."""
        policy, learner, trainer, _ = self._require_model()
        info = learner.last_info
        progress = {
            "algorithm": type(policy).__name__,
            "envSteps": learner.env_steps,
            "updates": learner.train_iter,
            "mode": self.mode,
            "loss": info.get("loss"),
            **trainer.progress(),
        }
        epsilon = policy.exploration(learner.env_steps)
        if epsilon is not None:
            progress["epsilon"] = float(epsilon)
        return progress

    def metrics(self) -> list[Metric]:
        """The learner's env steps, updates and last losses, the replay's fill and the
        exploration rate: read as they are (a scrape never pauses the learner)."""
        model = self._model
        if model is None:
            return []
        learner, policy = model.learner, model.policy
        samples = [
            Metric(
                "env_steps_total", "counter", "Env steps the learner was sent", learner.env_steps
            ),
            Metric("learner_updates_total", "counter", "Gradient updates", learner.train_iter),
        ]
        for key, value in dict(learner.last_info).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                samples.append(
                    Metric(
                        "learner_last",
                        "gauge",
                        "The last update's figures (losses, KL, clip fraction, ...) by name",
                        value,
                        (("name", key),),
                    )
                )
        buffer = getattr(model.trainer, "buffer", None)
        if buffer is not None:
            samples.append(
                Metric("buffer_items", "gauge", "Items in the replay buffer", buffer.count())
            )
        epsilon = policy.exploration(learner.env_steps)
        if epsilon is not None:
            samples.append(Metric("exploration_epsilon", "gauge", "Epsilon now", float(epsilon)))
        return samples

    def _build(
        self, obs_space: spaces.Space, act_space: spaces.Space, checkpoint: Optional[dict] = None
    ) -> None:
        seed = self.config["seed"]
        policy = self.policy_cls(
            self.config["policy"],
            obs_space,
            act_space,
            seed=seed,
            device=resolve_device(self.config["device"]),
        )
        norm = self.config["normalize"]
        self.normalizer = (
            Normalizer(
                norm,
                obs_space.shape or (),  # (a Dict's shape: None)
                policy.config["learn"]["gamma"],
            )
            if norm["obs"] or norm["reward"]
            else None
        )
        hooks: list[Hook] = []
        if self.config["log_every"]:
            saved = checkpoint["learner"] if checkpoint else {}
            hooks.append(
                LogHook(
                    self.data_dir / "logs",
                    every=self.config["log_every"],
                    resumed_at=saved.get("train_iter"),
                    resumed_env_steps=saved.get("env_steps"),
                )
            )
        if self.config["checkpoint_every"]:
            hooks.append(
                CheckpointHook(
                    self.data_dir / "checkpoints" / "latest.pt",
                    every=self.config["checkpoint_every"],
                    state=self._checkpoint_state,
                )
            )
        learner = Learner(policy.learn_mode, hooks)
        trainer = policy.trainer_cls.from_agent_config(
            policy,
            learner,
            self.config,
            seed=seed,
            normalizer=self.normalizer,
            augment=self._augmented if self.config.get("augment") else None,
        )
        if trainer.warming_up:  # acts uniformly at random until learning starts
            self.warmup = RandomPolicy(None, obs_space, act_space, seed=seed)
        actor = Actor(policy, self.warmup, self.normalizer, keep_obs=not trainer.normalizes_samples)
        self._model = _Model(policy, learner, trainer, actor)
        if checkpoint is not None:
            self._restore(self._model, checkpoint)
        self.update_status(self.progress())

    def _augmented(self, transition: dict) -> list[dict]:
        """A transition's images under the game's board symmetries (`augment`), which the
        game named at registration (checked there): the trainer stores them all."""
        augment = self.augment
        assert augment is not None  # (the trainer is given this only when augment is set)
        return augment.augment(transition)

    def _checkpoint_state(self) -> dict:
        """What saveModel and the periodic hook write and buildModel(path) reads: weights,
        optimizer and counters (learner), what the trainer holds between updates (trainer:
        schedule position, n-step windows or the PPO rollout so far, the replay buffer when
        `checkpoint_buffer`), the random generators, and the config and spaces to rebuild
        the model, and the normaliser's statistics.
        """
        policy, learner, trainer, _ = self._require_model()
        with trainer.paused():  # (learn_in background: no step while it is read)
            return {
                "agent": type(self).__name__,
                "format": CHECKPOINT_FORMAT,
                "config": self.config,
                "spaces": {
                    "observation": space_to_dict(policy.observation_space),
                    "action": space_to_dict(policy.action_space),
                },
                "learner": learner.state_dict(),
                "trainer": trainer.state_dict(),
                "rng": {
                    "policy": policy.rng_state(),
                    "warmup": self.warmup.rng_state() if self.warmup else None,
                },
                "normalizer": self.normalizer.state_dict() if self.normalizer else None,
            }

    def _restore(self, model: _Model, checkpoint: dict) -> None:
        model.learner.load_state_dict(checkpoint["learner"])  # first: the trainer's pushes
        if "trainer" not in checkpoint:  # format 1: weights and counters only
            return
        model.trainer.load_state_dict(checkpoint["trainer"])
        if self.normalizer is not None:
            self.normalizer.load_state_dict(checkpoint.get("normalizer"))
        model.policy.load_rng_state(checkpoint["rng"]["policy"])
        if self.warmup is not None:
            self.warmup.load_rng_state(checkpoint["rng"]["warmup"])

    def _require_model(self) -> _Model:
        if self._model is None:
            raise RuntimeError("no model yet: call buildModel, then register the agent")
        return self._model

    def _drop_model(self) -> None:
        if self._model is not None:  # (a learner thread stops first: it uses the learner)
            self._model.trainer.close()
            self._model.learner.close()
        self._model = self.warmup = self.normalizer = None
