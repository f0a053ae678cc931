"""DQN with the usual improvements, each a config switch: double Q-learning, a dueling head,
n-step returns (the batch's `gamma_n`), prioritized replay (the batch's IS `weight` in, new
priorities out) and a hard or soft target network. It learns from `ReplaySamples`.

    learn:   TD target  r + gamma_n * (1 - terminated) * Q_target(s', argmax_a Q(s', a)),
             a ranging over the legal actions of s' when transitions carry next_action_mask
             loss       IS-weighted Huber (or MSE) of Q(s, a) against that target
    collect: epsilon-greedy, epsilon from a schedule of env steps
    eval:    argmax
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from gymnasium import spaces

from mistk_rl.rl.data.collate import Batch
from mistk_rl.rl.data.samples import ReplaySamples
from mistk_rl.rl.models import QNetwork, without_aliases
from mistk_rl.rl.policies.base import Policy, adam
from mistk_rl.rl.schedules import make_schedule
from mistk_rl.rl.trainers import OffPolicyTrainer
from mistk_rl.rl.wrappers import ArgmaxSample, EpsGreedySample, TargetNetwork


class DQNPolicy(Policy[ReplaySamples]):
    trainer_cls = OffPolicyTrainer
    masks_next_actions = True
    action_space: spaces.Discrete  # (action_spaces: the constructor checks)

    @classmethod
    def default_config(cls) -> dict:
        return {
            # encoder: "auto" (by the space) or "conv" (a board's planes through a CNN)
            "model": {
                "hidden_sizes": [256, 256],
                "dueling": False,
                "activation": "relu",
                "encoder": "auto",
            },
            "learn": {
                "lr": 2.3e-3,
                "batch_size": 64,
                "gamma": 0.99,
                "double": True,
                "loss": "huber",  # or "mse"
                "grad_clip": 10.0,  # max grad norm; null disables
                "target": {"update": "hard", "every": 128, "tau": 0.005},
            },
            "nstep": 1,
            "collect": {"eps": {"type": "linear", "start": 1.0, "end": 0.04, "duration": 8000}},
        }

    def _init(self) -> None:
        cfg = self.config
        model = cfg["model"]
        self.model = QNetwork(
            self.observation_space,
            int(self.action_space.n),
            hidden_sizes=tuple(model["hidden_sizes"]),
            dueling=model["dueling"],
            activation=model["activation"],
            encoder=model["encoder"],
        ).to(self.device)
        if self.learns:
            target = cfg["learn"]["target"]
            self.target = TargetNetwork(
                self.model, update=target["update"], every=target["every"], tau=target["tau"]
            )
            self.optimizer = adam(self.model.parameters(), lr=cfg["learn"]["lr"])
        self.collect_model = EpsGreedySample(
            self.model, rng=self.rng, action_n=int(self.action_space.n)
        )
        self.eval_model = ArgmaxSample(self.model)
        self.epsilon = make_schedule(cfg["collect"]["eps"])
        if cfg["learn"]["loss"] not in ("huber", "mse"):
            raise ValueError(f"learn.loss must be 'huber' or 'mse', not {cfg['learn']['loss']!r}")

    def _forward_learn(self, batch: ReplaySamples) -> dict:
        cfg = self.config["learn"]
        obs, next_obs = batch.obs, batch.next_obs  # raw: the model's encoder encodes
        action = batch.action.long().view(-1)
        reward = batch.reward.float().view(-1)
        not_done = 1.0 - batch.terminated.float().view(-1)
        gamma_n = (
            batch.gamma_n.float().view(-1)
            if batch.gamma_n is not None
            else torch.full_like(reward, cfg["gamma"])
        )
        if not self.model.training:  # (a module-tree walk per update otherwise)
            self.model.train()
        q = self.model(obs)["logit"].gather(1, action[:, None]).squeeze(1)
        td_target = self._td_target(next_obs, reward, not_done, gamma_n, batch.next_action_mask)
        td_error = q - td_target
        per_sample = (
            F.smooth_l1_loss(q, td_target, reduction="none")
            if cfg["loss"] == "huber"
            else td_error.pow(2)
        )
        # prioritized replay: weight by importance sampling; new priorities go back out
        weight = batch.weight.float().view(-1) if batch.weight is not None else 1.0
        loss = (per_sample * weight).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg["grad_clip"])
            if cfg["grad_clip"]
            else torch.tensor(0.0)
        )
        self.optimizer.step()
        self.target.step()
        return {
            "loss": loss.item(),
            "q_mean": q.mean().item(),
            "td_abs_mean": td_error.abs().mean().item(),
            "grad_norm": float(grad_norm),
            "priority": td_error.detach().abs().cpu().numpy(),
        }

    @torch.no_grad()
    def _td_target(
        self,
        next_obs: Batch,
        reward: torch.Tensor,
        not_done: torch.Tensor,
        gamma_n: torch.Tensor,
        legal: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """r + gamma_n * (1 - terminated) * Q_target(s', a*), a* the best legal action."""
        target_q = self.target(next_obs)["logit"]
        if self.config["learn"]["double"]:
            best = _masked(self.model(next_obs)["logit"], legal).argmax(dim=1, keepdim=True)
            next_q = target_q.gather(1, best).squeeze(1)
        else:
            next_q = _masked(target_q, legal).max(dim=1).values
        if legal is not None:  # no legal action (the episode is over): nothing to add
            next_q = torch.where(legal.bool().any(dim=1), next_q, torch.zeros_like(next_q))
        return reward + gamma_n * not_done * next_q

    def _forward_collect(
        self, obs: torch.Tensor, mask: Optional[torch.Tensor], env_step: int
    ) -> dict:
        with torch.inference_mode():
            return self.collect_model(obs, eps=self.exploration(env_step), mask=mask)

    def exploration(self, env_step: int) -> float:
        """Collect mode's epsilon: the override episodeStarted set, else the schedule's."""
        if self.epsilon_override is not None:
            return self.epsilon_override
        return self.epsilon(env_step)

    def _forward_eval(self, obs: torch.Tensor, mask: Optional[torch.Tensor]) -> dict:
        with torch.inference_mode():
            return self.eval_model(obs, mask=mask)

    def _state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def _load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(without_aliases(state["model"]))
        self.target.load_state_dict(
            {**state["target"], "model": without_aliases(state["target"]["model"])}
        )
        self.optimizer.load_state_dict(state["optimizer"])


def _masked(q: torch.Tensor, legal: Optional[torch.Tensor]) -> torch.Tensor:
    """Q values with illegal actions at -inf, so max and argmax range over legal ones: in
    turn-based games the max over all actions bootstraps from moves that cannot be made."""
    return q if legal is None else q.masked_fill(~legal.bool(), float("-inf"))
