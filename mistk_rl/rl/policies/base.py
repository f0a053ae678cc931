"""`Policy`: one model, three modes.

`learn_mode`, `collect_mode` and `eval_mode` are plain interface collections (namedtuples of
bound methods), as in DI-engine: a learner only ever sees `learn_mode`, a collector only
`collect_mode`. That keeps exploration out of evaluation and the optimiser out of collection,
while the modes share one set of weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Generic, Mapping, NamedTuple, Optional

import numpy as np
import torch
from gymnasium import spaces

from mistk_rl.rl.config import deep_merge
from mistk_rl.rl.data.transition_batch import TransitionBatch
from mistk_rl.rl.learner import LearnMode, SamplesT, UpdatePlan
from mistk_rl.rl.trainers import Trainer


class CollectMode(NamedTuple):
    forward: Callable[..., dict]  # (obs, mask, env_step) -> {"action", ...} with exploration
    process_transition: Callable[..., dict]  # model output + env feedback -> a transition
    reset: Callable[[], None]


class EvalMode(NamedTuple):
    forward: Callable[..., dict]  # (obs, mask) -> {"action", ...}, greedy
    reset: Callable[[], None]


def adam(params: Any, lr: float, **kwargs: Any) -> torch.optim.Adam:
    """Adam with the fused kernel: one pass over all parameters, about 20% off a small
    model's update on CPU (the results match the for-loop version to float precision)."""
    return torch.optim.Adam(params, lr=lr, fused=True, **kwargs)


class Policy(ABC, Generic[SamplesT]):
    """Base of DQN, PPO and the random policy. Subclasses declare `default_config()` and
    implement the `_forward_*` methods; `self.config` is the merged config. The type
    parameter is the kind of batch the policy learns from (`ReplaySamples`, `RolloutSamples`).

    `device`: where `_init` puts the model, its target network and optimizer, after
    building the model on the CPU (so its initial weights do not depend on the device);
    None: torch's default device (the CPU, or the meta device inside `with
    torch.device("meta")`, where the agent checks a model's size). The `_forward_*` methods
    take tensors already there: the actor and the learner move them (`mistk_rl.rl.device`).

    `learns=False`: a copy that only acts (local inference) gets no optimiser and no target
    network. Building the first optimiser in a process imports torch._dynamo, about 1.4 s
    on these machines, which a copy made inside a timed run would pay for nothing."""

    # what turns the transitions of an agent's stream into this policy's learn steps
    trainer_cls: ClassVar[type[Trainer]]
    # transitions keep the legal actions of next_obs ("next_action_mask") when the env gives
    # them, for learners that bootstrap from the next state's best action
    masks_next_actions: bool = False
    # the action spaces the policy can act in; anything else is a ValueError at construction
    # (the agent's registration check turns it into a 400)
    action_spaces: tuple[type[spaces.Space], ...] = (spaces.Discrete,)
    # the network it acts with, built by `_init` (`actor.weights` moves its parameters); the
    # random policy has none
    model: torch.nn.Module

    @classmethod
    def default_config(cls) -> dict:
        return {}

    def __init__(
        self,
        config: Optional[dict],
        observation_space: spaces.Space,
        action_space: spaces.Space,
        *,
        seed: Optional[int] = None,
        device: torch.device | str | None = None,
        learns: bool = True,
    ) -> None:
        if not isinstance(action_space, self.action_spaces):
            kinds = " or ".join(kind.__name__ for kind in self.action_spaces)
            raise ValueError(
                f"{type(self).__name__} needs a {kinds} action space, got {action_space}"
            )
        self.config = deep_merge(self.default_config(), config)
        self.observation_space, self.action_space = observation_space, action_space
        self.device = torch.get_default_device() if device is None else torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.learns = learns
        if seed is not None:
            torch.manual_seed(seed)
        self._init()

    @abstractmethod
    def _init(self) -> None:
        """Build the model and wrappers from `self.config`, on `self.device`, and where
        `self.learns`, the optimiser (and a target network)."""

    def transition_extras(self) -> dict[str, tuple[int, ...]]:
        """What a transition needs of the model's output when it acted (name -> shape of
        one row; `optional_extras` may be missing): a caller that acts with a copy of this
        policy (local inference) sends these with its experience."""
        return {}

    optional_extras: ClassVar[frozenset[str]] = frozenset()

    # episodeStarted's epsilon for its episodes, where `exploration` has one to override
    epsilon_override: Optional[float] = None

    def exploration(self, env_step: int) -> Optional[float]:
        """Collect mode's epsilon at `env_step` for an epsilon-greedy policy (the status shows
        it, episodeStarted may override it); None: this policy has none."""
        return None

    # ---- the modes --------------------------------------------------------------------
    @property
    def learn_mode(self) -> LearnMode:
        if not self.learns:
            raise RuntimeError(
                f"this {type(self).__name__} only acts (built with "
                "learns=False): it has no optimiser to learn with"
            )
        return LearnMode(
            self._forward_learn,
            self._state_dict,
            self._load_state_dict,
            self._plan_update,
            self._update_step,
            self.device,
        )

    @property
    def collect_mode(self) -> CollectMode:
        return CollectMode(self._forward_collect, self._process_transition, self._reset)

    @property
    def eval_mode(self) -> EvalMode:
        return EvalMode(self._forward_eval, self._reset)

    # ---- to implement -----------------------------------------------------------------
    # an update of several gradient steps also runs a step at a time (`learner.UpdatePlan`):
    # `_plan_update(batch)` freezes it, `_update_step(plan)` runs the next step. None: one
    # `_forward_learn` call is one gradient step
    _plan_update: Optional[Callable[[SamplesT], UpdatePlan[SamplesT]]] = None
    _update_step: Optional[Callable[[UpdatePlan[SamplesT]], dict]] = None

    @abstractmethod
    def _forward_learn(self, batch: SamplesT) -> dict: ...

    @abstractmethod
    def _forward_collect(
        self, obs: torch.Tensor, mask: Optional[torch.Tensor], env_step: int
    ) -> dict: ...

    @abstractmethod
    def _forward_eval(self, obs: torch.Tensor, mask: Optional[torch.Tensor]) -> dict: ...

    def _process_transition(
        self,
        obs: Any,
        output: dict,
        reward: float,
        next_obs: Any,
        terminated: bool,
        truncated: bool,
    ) -> dict:
        """The transition to store: env feedback plus what the model said when acting."""
        return {
            "obs": obs,
            "action": output["action"],
            "reward": reward,
            "next_obs": next_obs,
            "terminated": terminated,
            "truncated": truncated,
            **self._kept_outputs(output),
        }

    def process_columns(
        self, steps: TransitionBatch, outputs: Mapping[str, Any]
    ) -> TransitionBatch:
        """`_process_transition` on columns: `steps` holds the env feedback (obs, action,
        reward, next_obs, terminated, truncated), `outputs` the model's columns when acting."""
        return steps.with_columns(**self._kept_outputs(outputs))

    def _kept_outputs(self, output: Mapping[str, Any]) -> dict[str, Any]:
        """What of the model's output when acting (a row's, or columns) a transition keeps
        besides the action; ValueError when it lacks what this policy learns from."""
        return {}

    def _reset(self) -> None:
        """Per-episode state (none for feed-forward policies)."""

    @abstractmethod
    def _state_dict(self) -> dict: ...

    @abstractmethod
    def _load_state_dict(self, state: dict) -> None: ...

    # ---- random state -------------------------------------------------------------------
    def rng_state(self) -> dict:
        """The policy's random generators (exploration, sampling, minibatch order), so that a
        policy restored from a checkpoint draws what the original would have drawn next."""
        return {
            "numpy": self.rng.bit_generator.state,
            "torch": {name: gen.get_state() for name, gen in self._generators().items()},
        }

    def load_rng_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["numpy"]
        for name, gen in self._generators().items():
            gen.set_state(state["torch"][name])

    def _generators(self) -> dict[str, torch.Generator]:
        """The torch generators the policy draws from besides `self.rng`."""
        return {}
