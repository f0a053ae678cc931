"""Implementations used by the end-to-end tests to inject failures and slow hooks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

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

    def do_act(self, batch):
        if self.fail_in == "get_action":
            raise RuntimeError("injected failure in do_act")
        return super().do_act(batch)


class BlockingAgent(RandomAgent):
    """RandomAgent whose build blocks until cancelled (at most 60 s)."""

    def do_build_model(self, path: Optional[Path]) -> None:
        self.update_status({"building": True})
        if not self.wait_for_cancel(60):
            raise TimeoutError("build was never cancelled")


class CountingAgent(RandomAgent):
    """RandomAgent that reports how many transitions it was asked to replay, and the modes
    its episodes started in."""

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        super().do_initialize(props, hparams)
        self.replayed = 0
        self.modes: list[str] = []

    def do_episode_started(self, episode) -> None:
        self.modes.append(episode.mode)
        self.update_status({"modes": list(self.modes)})

    def do_replay_action(self, batch) -> None:
        self.replayed += len(batch.actions)
        self.update_status({"replayed": self.replayed})

    def do_act(self, batch):
        acted = super().do_act(batch)
        if batch.action_mask is not None:
            masked = getattr(self, "masked", 0) + 1
            chosen = batch.action_mask.reshape(len(batch), -1)[
                np.arange(len(batch)), acted.actions.astype(int)
            ]
            bad = getattr(self, "violations", 0) + int((~chosen.astype(bool)).sum())
            self.masked, self.violations = masked, bad
            self.update_status({"masked": masked, "violations": bad})
        return acted
