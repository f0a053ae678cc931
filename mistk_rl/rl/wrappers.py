"""Model wrappers: one shared model, a different behaviour per policy mode.

A policy builds one model and wraps it per mode (DI-engine's `model_wrap`): DQN acts with
`EpsGreedySample` when collecting, `ArgmaxSample` when evaluating, and learns against a
`TargetNetwork`; PPO collects with `MultinomialSample` (discrete) or `GaussianSample` (Box).
Wrappers hold a reference to the model, not a copy, so an update made through one is seen by
all (only `TargetNetwork` copies, on purpose). The model's `forward(obs)` must return a dict
whose "logit" entry holds Q values or policy logits [B, action_n] (`GaussianSample`: "mu" and
"log_std" instead); wrappers add "action" and pass the other entries through.

Every discrete wrapper takes an optional action mask [B, action_n] (bool or 0/1; true = allowed).
Masked actions get logit -inf and are never chosen. Wrappers do not switch off gradients:
call them under `torch.no_grad()` when acting, and with gradients for PPO's evaluation of
stored actions.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from mistk_rl.rl.data.collate import Batch, batch_len

TensorDict = dict[str, torch.Tensor]


def apply_mask(logits: torch.Tensor, mask: torch.Tensor | np.ndarray | None) -> torch.Tensor:
    """`logits` with disallowed actions set to -inf; ValueError if a row allows none."""
    if mask is None:
        return logits
    allowed = torch.as_tensor(mask, device=logits.device).bool()
    if allowed.shape != logits.shape:
        raise ValueError(
            f"action mask shape {tuple(allowed.shape)} does not match logits {tuple(logits.shape)}"
        )
    if not allowed.any(dim=-1).all():
        raise ValueError("the action mask allows no action for some batch row")
    return logits.masked_fill(~allowed, float("-inf"))


class ModelWrapper:
    """Base: calling the wrapper runs `forward`; parameters, state and train/eval mode are
    those of `module` (the wrapped model itself, unless a subclass says otherwise)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def module(self) -> nn.Module:
        """The network this wrapper runs and whose parameters, state and mode it exposes."""
        return self.model

    def forward(self, obs: Batch, *args: Any, **kwargs: Any) -> TensorDict:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> TensorDict:
        return self.forward(*args, **kwargs)

    def _masked_output(self, obs: Batch, mask: torch.Tensor | None) -> TensorDict:
        output = dict(self.module(obs))
        output["logit"] = apply_mask(output["logit"], mask)
        return output

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        return self.module.parameters(recurse)

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> Any:
        return self.module.load_state_dict(state, strict=strict)

    def train(self, mode: bool = True) -> ModelWrapper:
        self.module.train(mode)
        return self

    def eval(self) -> ModelWrapper:
        return self.train(False)

    @property
    def training(self) -> bool:
        return self.module.training

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r})"


class ArgmaxSample(ModelWrapper):
    """Greedy: the allowed action with the highest logit (evaluation)."""

    def forward(self, obs: Batch, mask: torch.Tensor | None = None) -> TensorDict:
        output = self._masked_output(obs, mask)
        return {**output, "action": output["logit"].argmax(dim=-1)}


class EpsGreedySample(ModelWrapper):
    """With probability `eps` a uniformly random allowed action, else the greedy one.

    `rng` (a numpy or torch generator) makes exploration reproducible; None uses torch's
    global generator. Given `action_n` (or a mask, whose width says it), a call in which every
    row explores skips the forward pass, as SB3's DQN does: early in training, when eps is
    near 1, that is most calls (the output then holds only "action").
    """

    def __init__(
        self,
        model: nn.Module,
        rng: np.random.Generator | torch.Generator | None = None,
        action_n: int | None = None,
    ) -> None:
        super().__init__(model)
        self.rng = rng
        self.action_n = action_n

    def _uniform(self, *shape: int) -> torch.Tensor:
        if isinstance(self.rng, np.random.Generator):
            return torch.from_numpy(self.rng.random(shape, dtype=np.float32))
        return torch.rand(shape, generator=self.rng)

    def _random_allowed(self, allowed: torch.Tensor) -> torch.Tensor:
        """A uniformly random allowed action per row: the argmax of uniform scores."""
        scores = self._uniform(*allowed.shape).to(allowed.device)
        return scores.masked_fill(~allowed, -1.0).argmax(dim=-1)

    def forward(self, obs: Batch, eps: float, mask: torch.Tensor | None = None) -> TensorDict:
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"eps must be in [0, 1], got {eps}")
        batch = batch_len(obs)
        explore = self._uniform(batch) < eps
        width = mask.shape[-1] if mask is not None else self.action_n
        if width is not None and bool(explore.all()):
            allowed = ~torch.isneginf(apply_mask(torch.zeros(batch, width), mask))  # checked
            return {"action": self._random_allowed(allowed)}
        output = self._masked_output(obs, mask)
        logits = output["logit"]
        action = logits.argmax(dim=-1)
        if bool(explore.any()):  # (most calls explore nowhere once eps has decayed)
            random_action = self._random_allowed(~torch.isneginf(logits))
            action = torch.where(explore.to(logits.device), random_action, action)
        return {**output, "action": action}


class MultinomialSample(ModelWrapper):
    """Samples from softmax(logits) over the allowed actions (on-policy collection).

    Also returns "log_prob" and "entropy". Given `action=`, it evaluates those actions
    instead of sampling, with gradients, as PPO's update needs.
    """

    def __init__(self, model: nn.Module, generator: torch.Generator | None = None) -> None:
        super().__init__(model)
        self.generator = generator

    def forward(
        self,
        obs: Batch,
        mask: torch.Tensor | None = None,
        action: torch.Tensor | None = None,
    ) -> TensorDict:
        output = self._masked_output(obs, mask)
        # no argument validation: it costs more than the sampling on the per-step path
        dist = torch.distributions.Categorical(logits=output["logit"], validate_args=False)
        if action is None:  # drawn on the CPU, whose generator is the policy's (checkpointed)
            action = torch.multinomial(dist.probs.cpu(), 1, generator=self.generator).squeeze(-1)
        action = torch.as_tensor(action, device=dist.logits.device).long()
        return {
            **output,
            "action": action,
            "log_prob": dist.log_prob(action),
            "entropy": dist.entropy(),
        }


LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_log_prob_entropy(
    mu: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-density of `action` [B, d] under the diagonal Gaussian N(mu, exp(log_std)^2) and
    its entropy, each summed over the d action dimensions -> [B]. Written out rather than
    through `torch.distributions.Normal`, whose construction costs more than the arithmetic
    on the per-step path; the tests check it against Normal."""
    z = (action - mu) * torch.exp(-log_std)
    log_prob = (-0.5 * z.pow(2) - log_std - LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + LOG_SQRT_2PI + log_std).sum(-1)
    return log_prob, entropy


class GaussianSample(ModelWrapper):
    """Samples a ~ N(mu, std^2) from a model returning "mu" and "log_std" [B, d] (continuous
    on-policy collection); `deterministic=True` takes the mean (evaluation).

    Also returns "log_prob" and "entropy" (summed over action dims). The action is the
    unbounded sample: clipping it to the action space's bounds is the env's side (the policy
    sends the clipped one, the log-prob stays the sample's, as SB3 and CleanRL do). Given
    `action=`, it evaluates those actions with gradients, as PPO's update needs. Action masks
    mean nothing for continuous actions: passing one is an error.
    """

    def __init__(self, model: nn.Module, generator: torch.Generator | None = None) -> None:
        super().__init__(model)
        self.generator = generator

    def forward(
        self,
        obs: Batch,
        mask: torch.Tensor | None = None,
        action: torch.Tensor | None = None,
        deterministic: bool = False,
    ) -> TensorDict:
        if mask is not None:
            raise ValueError("action masks apply to discrete actions only")
        output = dict(self.module(obs))
        mu, log_std = output["mu"], output["log_std"]
        if action is None:
            if deterministic:
                action = mu
            else:
                noise = torch.randn(mu.shape, generator=self.generator, dtype=mu.dtype)
                action = mu + noise.to(mu.device) * log_std.exp()
        action = torch.as_tensor(action, dtype=mu.dtype, device=mu.device).reshape(mu.shape)
        log_prob, entropy = gaussian_log_prob_entropy(mu, log_std, action)
        return {**output, "action": action, "log_prob": log_prob, "entropy": entropy}


class TargetNetwork(ModelWrapper):
    """A frozen copy of the model for TD targets, kept in step with the online model.

    Call `step()` after each learner update. "hard" copies the online weights every `every`
    steps (DQN); "soft" moves them toward the online ones on every step by
    θ' ← τθ + (1 − τ)θ' (Polyak averaging). Parameters, state and mode are the copy's; the
    state also holds the step counter, so a resumed run copies on the same schedule.
    """

    def __init__(
        self, model: nn.Module, update: str = "hard", every: int = 100, tau: float = 0.005
    ) -> None:
        if update not in ("hard", "soft"):
            raise ValueError(f"update must be 'hard' or 'soft', got {update!r}")
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}")
        super().__init__(model)
        self.update, self.every, self.tau = update, every, tau
        self.target = copy.deepcopy(model).eval().requires_grad_(False)
        self.steps = 0

    @property
    def module(self) -> nn.Module:
        return self.target

    def forward(self, obs: Batch, mask: torch.Tensor | None = None) -> TensorDict:
        with torch.no_grad():
            return self._masked_output(obs, mask)

    def step(self) -> None:
        """Count one learner update and refresh the target when the schedule says so."""
        self.steps += 1
        if self.update == "soft":
            self._soft_update()
        elif self.steps % self.every == 0:
            self.sync()

    def sync(self) -> None:
        """Copy the online weights into the target now."""
        self.target.load_state_dict(self.model.state_dict())

    @torch.no_grad()
    def _soft_update(self) -> None:
        for target, online in zip(self.target.parameters(), self.model.parameters()):
            target.lerp_(online, self.tau)
        for kept, current in zip(self.target.buffers(), self.model.buffers()):
            kept.copy_(current)  # running statistics are not averaged (as in SB3)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.target.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> Any:
        self.steps = int(state["steps"])
        return self.target.load_state_dict(state["model"], strict=strict)
