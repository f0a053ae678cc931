"""What the episode players (columns, stream) need of the agent suite that runs them,
as a Protocol, so they depend on it without importing it."""

from __future__ import annotations

from typing import Any, Optional, Protocol

import gymnasium as gym

from mistk_rl.conformance.probe import Probe, Reply


class AgentHost(Protocol):
    envs: list[gym.Env]
    obs: list[Any]
    first_obs: Any
    act_space: gym.Space
    probe: Probe
    token: Optional[str]

    def expect(self, name: str, operation_id: str, statuses: Any, **kw: Any) -> Reply: ...

    def check(
        self, name: str, ok: bool, detail: str = "", answer: Optional[Reply] = None
    ) -> bool: ...

    def state(self) -> Optional[str]: ...

    def settle(self, name: str, want: Optional[str] = None) -> Optional[str]: ...

    def start_episode(self, obs: Optional[Any] = None, prefix: str = "ready") -> Reply: ...
