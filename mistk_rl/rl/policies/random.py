"""Uniformly random actions among the allowed ones: the warm-up policy that fills a replay
buffer before learning starts (and a baseline)."""

from __future__ import annotations

from typing import Optional

import torch
from gymnasium import spaces

from mistk_rl.rl.data.collate import batch_len
from mistk_rl.rl.data.samples import Samples
from mistk_rl.rl.policies.base import Policy


class RandomPolicy(Policy[Samples]):
    action_space: spaces.Discrete  # (action_spaces: the constructor checks)

    def _init(self) -> None:
        self.generator = torch.Generator().manual_seed(int(self.rng.integers(2**31)))

    def _sample(self, obs: torch.Tensor, mask: Optional[torch.Tensor]) -> dict:
        if mask is None:  # (multinomial over equal weights cost 29 us a call, randint 2)
            return {
                "action": torch.randint(
                    int(self.action_space.n), (batch_len(obs),), generator=self.generator
                )
            }
        return {"action": torch.multinomial(mask.float(), 1, generator=self.generator).view(-1)}

    def _forward_collect(
        self, obs: torch.Tensor, mask: Optional[torch.Tensor], env_step: int
    ) -> dict:
        return self._sample(obs, mask)

    def _forward_eval(self, obs: torch.Tensor, mask: Optional[torch.Tensor]) -> dict:
        return self._sample(obs, mask)

    def _forward_learn(self, batch: Samples) -> dict:
        return {}

    def _generators(self) -> dict[str, torch.Generator]:
        return {"sampling": self.generator}

    def _state_dict(self) -> dict:
        return {}

    def _load_state_dict(self, state: dict) -> None:
        pass
