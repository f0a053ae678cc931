"""PPO (clipped objective) for Discrete and Box action spaces.

Discrete actions come from a categorical over the policy logits; Box actions from a diagonal
Gaussian with a state-independent log-std (SB3, CleanRL), flattened to prod(shape) dims.

    collect: sample from the policy; remember log-prob and value with each transition. A Box
             action is sent to the env clipped to the space's bounds ("env_action") while the
             transition keeps the sampled one and its log-prob (SB3 and CleanRL do the same:
             the ratio is then taken between densities of the same unbounded sample). An
             action mask stays with the transition: the learner's log-prob of the action is
             taken under the mask it was sampled under, or the ratio starts away from 1
    learn:   one update per rollout, a `RolloutSamples` (advantages from GAE, by the trainer):
             `epochs` passes of shuffled minibatches (planned at once, run a minibatch step
             at a time by a trainer that bounds its work per request), advantage
             normalisation per minibatch,
             loss = -min(r A, clip(r, 1-eps, 1+eps) A) + c_v (V - R)^2 - c_e H, grad clipping;
             lr and clip range optionally annealed linearly to 0 over `anneal_env_steps`;
             each update reports the rollout's explained variance (the values GAE used,
             of the weights at the rollout's end, against the returns: how much of the
             returns the critic predicts before it is fitted to them)
    eval:    argmax of the policy logits; the Gaussian's mean (clipped) for Box
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
import torch
from gymnasium import spaces

from mistk_rl.rl.data.collate import Batch, batch_len, batch_rows, to_device
from mistk_rl.rl.data.samples import RolloutSamples
from mistk_rl.rl.learner import UpdatePlan
from mistk_rl.rl.models import ActorCritic, ActorCriticModel, without_aliases
from mistk_rl.rl.policies.base import Policy, adam
from mistk_rl.rl.trainers import OnPolicyTrainer
from mistk_rl.rl.wrappers import ArgmaxSample, GaussianSample, MultinomialSample


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target), as SB3 logs it for the rollout's values
    against their GAE targets: near 1 when the critic tells states apart, near 0 (or below)
    when it does no better than one value for all; nan when the targets do not vary."""
    target_var = target.double().var(unbiased=False).item() if len(target) else 0.0
    if target_var == 0.0:
        return float("nan")
    return 1.0 - (target.double() - predicted.double()).var(unbiased=False).item() / target_var


class PPOPolicy(Policy[RolloutSamples]):
    trainer_cls = OnPolicyTrainer
    action_spaces: tuple[type[spaces.Space], ...] = (spaces.Discrete, spaces.Box)
    action_space: spaces.Discrete | spaces.Box  # (one of action_spaces: the constructor checks)
    model: ActorCriticModel

    @classmethod
    def default_config(cls) -> dict:
        return {
            # log_std_init: the Gaussian's initial log-std (Box action spaces only);
            # encoder: "auto" (by the space) or "conv" (a board's planes through a CNN)
            "model": {
                "hidden_sizes": [64, 64],
                "activation": "tanh",
                "share_encoder": False,
                "log_std_init": 0.0,
                "encoder": "auto",
            },
            "learn": {
                "lr": 1e-3,
                "epochs": 20,
                "batch_size": 256,
                "clip": 0.2,
                "value_coef": 0.5,
                "entropy_coef": 0.0,
                "gamma": 0.98,
                "gae_lambda": 0.8,
                "adv_norm": True,
                "grad_clip": 0.5,
                "anneal_env_steps": None,  # linear decay of lr and clip to 0 (rl-zoo's lin_)
            },
            # eval mode acts with the policy's mode (deterministic) or samples it, as SB3's
            # evaluate_policy(deterministic=False): a greedy policy that has not learned a
            # puzzle walks into the same wall until the step cap
            "eval": {"deterministic": True},
        }

    def _init(self) -> None:
        cfg = self.config
        space = self.action_space
        self.continuous = isinstance(space, spaces.Box)
        if isinstance(space, spaces.Box):
            self.action_n = int(np.prod(space.shape))
            self._action_shape = space.shape
            # float32 bounds as tensors, once: clipping runs on every step
            self._low, self._high = (
                torch.as_tensor(b, dtype=torch.float32, device=self.device).reshape(-1)
                for b in (space.low, space.high)
            )
        else:
            self.action_n = int(space.n)
        self.model = self._build_model(cfg["model"]).to(self.device)
        if self.learns:
            self.optimizer = adam(self.model.parameters(), lr=cfg["learn"]["lr"], eps=1e-5)
        # the policy's own generators: seeded runs never depend on torch's global RNG
        self.torch_rng = torch.Generator().manual_seed(int(self.rng.integers(2**31)))
        self.sampling_rng = torch.Generator().manual_seed(int(self.rng.integers(2**31)))
        self.collect_model: GaussianSample | MultinomialSample
        self.eval_model: GaussianSample | MultinomialSample | ArgmaxSample
        if self.continuous:
            self.collect_model = GaussianSample(self.model, generator=self.sampling_rng)
            self.eval_model = GaussianSample(self.model)
        else:
            self.collect_model = MultinomialSample(self.model, generator=self.sampling_rng)
            self.eval_model = (
                ArgmaxSample(self.model)
                if cfg["eval"]["deterministic"]
                else MultinomialSample(
                    self.model,
                    generator=torch.Generator().manual_seed(int(self.rng.integers(2**31))),
                )
            )

    def _build_model(self, model: dict) -> ActorCriticModel:
        """The actor-critic from the config's `model` section: the one place a subclass
        changes the network (`forward(obs) -> {"logit" or "mu", "log_std", "value"}` and
        `compute_critic(obs) -> {"value"}`)."""
        return ActorCritic(
            self.observation_space,
            self.action_n,
            hidden_sizes=tuple(model["hidden_sizes"]),
            activation=model["activation"],
            share_encoder=model["share_encoder"],
            continuous=self.continuous,
            log_std_init=model["log_std_init"],
            encoder=model["encoder"],
        )

    def _encode(self, obs: Batch) -> Batch:
        """Raw observations as a tensor (a dict of them for a Dict space): the model's
        encoders (chosen by the observation space) do the encoding."""
        if isinstance(obs, dict):
            return {key: torch.as_tensor(value) for key, value in obs.items()}
        return torch.as_tensor(obs)

    def value(self, obs: Batch) -> torch.Tensor:
        """V(obs) of CPU observations, on the CPU: a rollout's bootstrap at its end or at a
        truncation (the trainer's GAE runs on numpy)."""
        with torch.no_grad():
            obs = to_device(self._encode(obs), self.device)
            return self.model.compute_critic(obs)["value"].cpu()

    def _progress_left(self, env_steps: int) -> float:
        horizon = self.config["learn"]["anneal_env_steps"]
        return 1.0 if not horizon else max(0.0, 1.0 - env_steps / horizon)

    def _forward_learn(self, batch: RolloutSamples) -> dict:
        """The whole update at once: its plan, stepped through (`_plan_update`)."""
        plan = self._plan_update(batch)
        while plan.left:
            for key, value in self._update_step(plan).items():
                plan.stats.setdefault(key, []).append(value)
            plan.done += 1
        return plan.info()

    def _plan_update(self, batch: RolloutSamples) -> UpdatePlan[RolloutSamples]:
        """The update on a rollout as `epochs` x minibatch steps, each epoch's shuffle drawn
        now (in the order the one-shot loop drew them), with the lr and clip of the
        rollout's env step: run later, a step after a step, it is the same update."""
        cfg = self.config["learn"]
        left = self._progress_left(batch.env_steps)
        clip = cfg["clip"] * left if cfg["anneal_env_steps"] else cfg["clip"]
        n, size = batch_len(self._encode(batch.obs)), cfg["batch_size"]
        rows = []
        for _ in range(cfg["epochs"]):
            order = torch.randperm(n, generator=self.torch_rng)
            rows += [order[start : start + size] for start in range(0, n, size)]
        return UpdatePlan(
            batch,
            rows,
            {"lr": cfg["lr"] * left, "clip": clip},
            stats={"explained_variance": [explained_variance(batch.value, batch.returns)]},
        )

    def _update_step(self, plan: UpdatePlan[RolloutSamples]) -> dict[str, float]:
        for group in self.optimizer.param_groups:  # (another plan may have run in between)
            group["lr"] = plan.settings["lr"]
        if not self.model.training:  # (a module-tree walk per update otherwise)
            self.model.train()
        # the rows were drawn on the CPU (its generator): indexing the device's batch with
        # them would copy them over once per field
        return self._minibatch_step(
            plan.batch,
            self._encode(plan.batch.obs),
            plan.rows[plan.done].to(self.device),
            plan.settings["clip"],
        )

    def _minibatch_step(
        self, batch: RolloutSamples, obs: Batch, idx: torch.Tensor, clip: float
    ) -> dict[str, float]:
        cfg = self.config["learn"]
        obs = batch_rows(obs, idx)
        advantage = batch.advantage[idx].float()
        if cfg["adv_norm"] and len(idx) > 1:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        mask = batch.action_mask[idx] if batch.action_mask is not None else None
        out = self.collect_model(obs, mask=mask, action=batch.action[idx])
        log_ratio = out["log_prob"] - batch.log_prob[idx].float()
        ratio = log_ratio.exp()
        policy_loss = -torch.min(
            ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage
        ).mean()
        value = out["value"] if "value" in out else self.model.compute_critic(obs)["value"]
        value_loss = (value - batch.returns[idx].float()).pow(2).mean()
        entropy = out["entropy"].mean()
        loss = policy_loss + cfg["value_coef"] * value_loss - cfg["entropy_coef"] * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg["grad_clip"])
        self.optimizer.step()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean().item()
            clip_frac = ((ratio - 1).abs() > clip).float().mean().item()
        return {
            "loss": loss.item(),
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
            "approx_kl": approx_kl,
            "clip_frac": clip_frac,
        }

    def _forward_collect(
        self, obs: torch.Tensor, mask: Optional[torch.Tensor], env_step: int
    ) -> dict:
        encoded = self._encode(obs)
        with torch.no_grad():
            out = self.collect_model(encoded, mask=mask)
            if "value" not in out:
                out["value"] = self.model.compute_critic(encoded)["value"]
        if self.continuous:
            out["env_action"] = self._clip(out["action"])
        if mask is not None:  # the learner evaluates the action under the same mask
            out["action_mask"] = mask
        return out

    optional_extras = frozenset({"action_mask"})  # (acting under a mask)

    def transition_extras(self) -> dict[str, tuple[int, ...]]:
        """The sampled action (for a Box: before clipping), its log-prob and the value."""
        space = self.action_space
        if isinstance(space, spaces.Box):
            return {"action": (int(np.prod(space.shape)),), "log_prob": (), "value": ()}
        return {"action": (), "log_prob": (), "value": (), "action_mask": (int(space.n),)}

    def _forward_eval(self, obs: torch.Tensor, mask: Optional[torch.Tensor]) -> dict:
        with torch.no_grad():
            if not self.continuous:
                return self.eval_model(self._encode(obs), mask=mask)
            out = self.eval_model(self._encode(obs), mask=mask, deterministic=True)
        out["action"] = out["env_action"] = self._clip(out["action"])  # nothing to learn from
        return out

    def _clip(self, action: torch.Tensor) -> torch.Tensor:
        """Sampled actions [B, d] clipped to the Box's bounds, in the space's shape."""
        clipped = torch.maximum(torch.minimum(action, self._high), self._low)
        return clipped.reshape(action.shape[0], *self._action_shape)

    def _kept_outputs(self, output: Mapping[str, Any]) -> dict[str, Any]:
        if "log_prob" not in output:  # the agent replays an action someone else chose
            raise ValueError(
                "this agent did not choose that action: an on-policy learner "
                "cannot use it (it has no log-prob or value of it)"
            )
        kept = {"log_prob": output["log_prob"], "value": output["value"]}
        if "action_mask" in output:
            kept["action_mask"] = output["action_mask"]
        return kept

    def _state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(without_aliases(state["model"]))
        self.optimizer.load_state_dict(state["optimizer"])

    def _generators(self) -> dict[str, torch.Generator]:
        return {"minibatch": self.torch_rng, "sampling": self.sampling_rng}
