"""Implementations used by the end-to-end tests to inject failures and slow hooks."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from agents.random_agent import RandomAgent


class FlakyAgent(RandomAgent):
    """RandomAgent that raises in the hook named by hyperparameter ``fail_in``."""

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        self.fail_in = hparams.get("fail_in")
        super().do_initialize(props, {k: v for k, v in hparams.items() if k != "fail_in"})

    def do_build_model(self, path: Optional[Path]) -> None:
        if self.fail_in == "build_model":
            raise RuntimeError("injected failure in do_build_model")
        super().do_build_model(path)

    def do_get_action(self, obs, action_mask=None):
        if self.fail_in == "get_action":
            raise RuntimeError("injected failure in do_get_action")
        return super().do_get_action(obs, action_mask)


class BlockingAgent(RandomAgent):
    """RandomAgent whose build blocks until cancelled (at most 60 s)."""

    def do_build_model(self, path: Optional[Path]) -> None:
        self.update_status({"building": True})
        if not self.wait_for_cancel(60):
            raise TimeoutError("build was never cancelled")
