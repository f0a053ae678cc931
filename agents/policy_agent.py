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
from typing import Any, Optional

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
from mistk_rl.framework.implementation import PROGRESS_EVERY_S
from mistk_rl.games.symmetries import GAMES, BoardSymmetries, symmetries_for
from mistk_rl.rl.actor import Actor
from mistk_rl.rl.actor import weights as actor_weights
from mistk_rl.rl.config import AgentConfigError, deep_merge, save_config
from mistk_rl.rl.device import resolve_device
from mistk_rl.rl.learner import CheckpointHook, Learner, LogHook, load_checkpoint, save_checkpoint
from mistk_rl.rl.normalize import Normalizer
from mistk_rl.rl.policies.base import Policy
from mistk_rl.rl.policies.random import RandomPolicy
from mistk_rl.rl.trainers import Trainer
from mistk_rl.spaces import space_from_dict, space_from_request, space_to_dict

CHECKPOINT_FORMAT = 2  # 2: + trainer and rng (format 1 restores weights and counters)


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
        self.policy: Optional[Policy] = None
        self.learner: Optional[Learner] = None
        self.trainer: Optional[Trainer] = None
        self.warmup: Optional[RandomPolicy] = None
        self.actor: Optional[Actor] = None
        self.normalizer: Optional[Normalizer] = None
        self.mode = "collect"
        self.augment: Optional[BoardSymmetries] = None  # set at registration

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
        if self.policy is None:
            self._check_model(self.config, observation_space, action_space)
            return
        built = (
            space_to_dict(self.policy.observation_space),
            space_to_dict(self.policy.action_space),
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
        if self.policy is None:  # (validate_registration checked the spaces)
            self._build(self.observation_space, self.action_space)

    def validate_episode_start(self, episode: EpisodeInfo) -> None:
        if episode.epsilon is not None and (
            self.policy is None or self.policy.exploration(0) is None
        ):
            raise InvalidRequest(
                f"epsilon: {type(self.policy).__name__} has no epsilon-greedy exploration to set"
            )

    def do_episode_started(self, episode: EpisodeInfo) -> None:
        self._require_model()
        self.mode = episode.mode
        self.policy.epsilon_override = episode.epsilon  # (None for policies without one)
        if self.normalizer is not None:
            self.normalizer.end_episodes()
        (self.policy.eval_mode if self.mode == "eval" else self.policy.collect_mode).reset()
        self.update_status({"mode": self.mode})

    def do_act(self, batch: Acting) -> Acted:
        """One forward pass for all rows. In collect mode the extras keep what the model
        said (the sampled action, log-prob, value; with obs normalisation for a rollout, the
        normalised observation it acted on): the service keeps them under each row's step
        id and hands them back with the transition (`do_learn`)."""
        self._require_model()
        actions, extras = self.actor.act(
            batch.obs,
            batch.action_mask,
            mode=self.mode,
            env_steps=self.learner.env_steps,
            warming_up=self.trainer.warming_up,
        )
        return Acted(actions, extras)

    def do_learn(self, transitions: Transitions) -> Optional[Callable[[], None]]:
        """Count the env steps now: exploration and the warm-up read the count when the
        next rows are acted on. If updates are due (or owed), learn now too, so the next
        rows are acted on with their weights, as always; otherwise storing the transitions
        (`_learn`) changes nothing acting reads and may wait for the step's answer."""
        self._require_model()
        if self.mode == "eval":
            return None  # evaluation episodes never train the agent
        self.learner.env_steps += len(transitions)
        if self.trainer.updates_due(len(transitions)):
            self._learn(transitions)
            return None
        return partial(self._learn, transitions)

    def _learn(self, transitions: Transitions) -> None:
        process = self.policy.collect_mode.process_transition
        next_masks = transitions.next_action_mask if self.policy.masks_next_actions else None
        # a rollout gets normalised obs and scaled rewards; a replay buffer raw ones, which
        # its trainer normalises when sampled (module doc)
        normalizer = None if self.trainer.normalizes_samples else self.normalizer
        keys = transitions.names if transitions.names is not None else transitions.envs.tolist()
        rewards = transitions.rewards.tolist()
        terminated, truncated = transitions.terminated.tolist(), transitions.truncated.tolist()
        extras, matched = transitions.extras, transitions.matched
        obs, next_obs = transitions.obs, transitions.next_obs
        row = (
            (lambda columns, i: {k: v[i] for k, v in columns.items()})
            if isinstance(obs, dict)
            else (lambda columns, i: columns[i])
        )
        # one step per entity at a time: rows of one entity (local inference's batches)
        # go in order, one round each; the trainer takes the rounds at once (one buffer
        # write for the batch) and nothing if a row is refused
        steps: list[dict] = []
        for rows in rounds(keys) if len(set(keys)) < len(keys) else [range(len(keys))]:
            if self.normalizer is not None:
                self.normalizer.update_rewards(
                    {keys[i]: rewards[i] for i in rows},
                    {keys[i]: terminated[i] or truncated[i] for i in rows},
                )
            batch = {}
            for i in rows:
                key = keys[i]
                # (numpy rows as kept: the buffer stores numpy, a rollout collates either)
                if matched is None or matched[i]:
                    output = {name: values[i] for name, values in extras.items()}
                    output.setdefault("action", transitions.actions[i])
                else:  # an action this agent did not choose: the action is all the policy
                    # gets (an on-policy one refuses it: it lacks what it said when acting)
                    output = {"action": transitions.actions[i]}
                prev_obs, reward, new_obs = output.pop("obs", None), rewards[i], row(next_obs, i)
                if normalizer is not None:
                    if prev_obs is None:
                        prev_obs = normalizer.obs(row(obs, i))
                    new_obs, reward = normalizer.obs(new_obs), float(normalizer.reward(reward))
                try:
                    batch[key] = process(
                        row(obs, i) if prev_obs is None else prev_obs,
                        output,
                        reward,
                        new_obs,
                        terminated[i],
                        truncated[i],
                    )
                except ValueError as exc:
                    raise ValueError(
                        f"replayAction for {key!r} with action {transitions.actions[i]}: {exc}"
                    ) from exc
                if next_masks is not None:
                    batch[key]["next_action_mask"] = np.asarray(next_masks[i], dtype=bool)
            steps.append(batch)
        self.trainer.observe_steps(steps)
        self.trainer.maybe_train()
        self.update_status(self.progress(), every_s=PROGRESS_EVERY_S)

    def do_policy_copy(self, weights: bool) -> PolicyDescription:
        """The policy's config and, when asked, the acting weights (local inference). An
        agent that normalises observations offers none: a copy would act on statistics
        that move only here."""
        self._require_model()
        if self.normalizer is not None and self.normalizer.norm_obs:
            raise InvalidRequest(
                "local inference: this agent normalises observations "
                "(normalize.obs), which a copy cannot follow; turn one off"
            )
        with self.trainer.paused():  # (learn_in background: no step while weights are read)
            return PolicyDescription(
                policy=type(self.policy).__name__,
                config=self.policy.config,
                observation_space=space_to_dict(self.policy.observation_space),
                action_space=space_to_dict(self.policy.action_space),
                seed=self.config["seed"],
                env_steps=self.learner.env_steps,
                warmup_until=(
                    self.config["train"].get("learning_starts", 0) if self.warmup is not None else 0
                ),
                version=self.learner.train_iter,
                extras=self.policy.transition_extras(),
                optional_extras=sorted(self.policy.optional_extras),
                weights=actor_weights(self.policy) if weights else None,
            )

    def do_episode_stopped(self) -> None:
        if self.trainer is not None and self.mode == "collect":
            self.trainer.end_all_episodes()
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
        info = self.learner.last_info
        progress = {
            "algorithm": type(self.policy).__name__,
            "envSteps": self.learner.env_steps,
            "updates": self.learner.train_iter,
            "mode": self.mode,
            "loss": info.get("loss"),
            **self.trainer.progress(),
        }
        epsilon = self.policy.exploration(self.learner.env_steps)
        if epsilon is not None:
            progress["epsilon"] = float(epsilon)
        return progress

    def _build(
        self, obs_space: spaces.Space, act_space: spaces.Space, checkpoint: Optional[dict] = None
    ) -> None:
        seed = self.config["seed"]
        self.policy = self.policy_cls(
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
                self.policy.config["learn"]["gamma"],
            )
            if norm["obs"] or norm["reward"]
            else None
        )
        hooks = []
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
        self.learner = Learner(self.policy.learn_mode, hooks)
        self.trainer = self.policy.trainer_cls.from_agent_config(
            self.policy,
            self.learner,
            self.config,
            seed=seed,
            normalizer=self.normalizer,
            augment=self._augmented if self.config.get("augment") else None,
        )
        if self.trainer.warming_up:  # acts uniformly at random until learning starts
            self.warmup = RandomPolicy(None, obs_space, act_space, seed=seed)
        self.actor = Actor(
            self.policy, self.warmup, self.normalizer, keep_obs=not self.trainer.normalizes_samples
        )
        if checkpoint is not None:
            self._restore(checkpoint)
        self.update_status(self.progress())

    def _augmented(self, transition: dict) -> list[dict]:
        """A transition's images under the game's board symmetries (`augment`), which the
        game named at registration (checked there): the trainer stores them all."""
        return self.augment.augment(transition)

    def _checkpoint_state(self) -> dict:
        """What saveModel and the periodic hook write and buildModel(path) reads: weights,
        optimizer and counters (learner), what the trainer holds between updates (trainer:
        schedule position, n-step windows or the PPO rollout so far, the replay buffer when
        `checkpoint_buffer`), the random generators, and the config and spaces to rebuild
        the model, and the normaliser's statistics.
        """
        with self.trainer.paused():  # (learn_in background: no step while it is read)
            return {
                "agent": type(self).__name__,
                "format": CHECKPOINT_FORMAT,
                "config": self.config,
                "spaces": {
                    "observation": space_to_dict(self.policy.observation_space),
                    "action": space_to_dict(self.policy.action_space),
                },
                "learner": self.learner.state_dict(),
                "trainer": self.trainer.state_dict(),
                "rng": {
                    "policy": self.policy.rng_state(),
                    "warmup": self.warmup.rng_state() if self.warmup else None,
                },
                "normalizer": self.normalizer.state_dict() if self.normalizer else None,
            }

    def _restore(self, checkpoint: dict) -> None:
        self.learner.load_state_dict(checkpoint["learner"])  # first: the trainer's pushes
        if "trainer" not in checkpoint:  # format 1: weights and counters only
            return
        self.trainer.load_state_dict(checkpoint["trainer"])
        if self.normalizer is not None:
            self.normalizer.load_state_dict(checkpoint.get("normalizer"))
        self.policy.load_rng_state(checkpoint["rng"]["policy"])
        if self.warmup is not None:
            self.warmup.load_rng_state(checkpoint["rng"]["warmup"])

    def _require_model(self) -> None:
        if self.policy is None:
            raise RuntimeError("no model yet: call buildModel, then register the agent")

    def _drop_model(self) -> None:
        if self.trainer is not None:  # (a learner thread stops first: it uses the learner)
            self.trainer.close()
        if self.learner is not None:
            self.learner.close()
        self.policy = self.learner = self.trainer = self.warmup = self.normalizer = None
        self.actor = None
