"""A columnar episode, as an orchestrator with several env copies plays it over stepColumns:
each request reports the outcome of every copy's last step on its row (step id, reward,
flags, the observation it led to); copies whose episode ended act on `reset.obs`; the last
request only reports (`act` false)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mistk_rl.conformance.host import AgentHost
from mistk_rl.conformance.values import in_space, json_value

MAX_REQUESTS = 600


class ColumnEpisode:
    def __init__(self, suite: AgentHost, prefix: str) -> None:
        self.suite, self.prefix = suite, prefix
        self.envs = suite.envs
        n = len(self.envs)
        self.obs = list(suite.obs)
        self.step_ids = [-1] * n
        self.rewards = [0.0] * n
        self.terminated = [False] * n
        self.truncated = [False] * n
        self.reset: dict[int, Any] = {}  # row -> the observation its new episode starts on
        self.ended = [False] * n

    def body(self, act: bool = True) -> dict[str, Any]:
        n = len(self.envs)
        body: dict[str, Any] = {
            "envs": list(range(n)),
            "obs": [json_value(o) for o in self.obs],
            "stepIds": list(self.step_ids),
            "rewards": list(self.rewards),
            "terminated": list(self.terminated),
            "truncated": list(self.truncated),
        }
        if not act:
            body["act"] = [False] * n
        elif self.reset:
            rows = sorted(self.reset)
            body["reset"] = {"rows": rows, "obs": [json_value(self.reset[r]) for r in rows]}
        return body

    def play(self) -> Optional[int]:
        steps = 0
        for _ in range(MAX_REQUESTS):
            answer = self.suite.expect(
                f"{self.prefix}.stepColumns", "stepColumns", [200], body=self.body()
            )
            actions, ids = answer.field("actions"), answer.field("stepIds")
            if not self.answered(answer, actions, ids):
                return None
            self.reset = {}
            for row, (env, action) in enumerate(zip(self.envs, actions)):
                space = self.suite.act_space
                new_obs, reward, term, trunc, _ = env.step(np.asarray(action, space.dtype))
                self.step_ids[row], self.rewards[row] = int(ids[row]), float(reward)
                self.terminated[row], self.truncated[row] = bool(term), bool(trunc)
                self.obs[row] = new_obs
                if term or trunc:
                    self.ended[row] = True
                    self.reset[row] = env.reset()[0]
            steps += len(self.envs)
            if all(self.ended):
                break
        last = self.suite.expect(
            f"{self.prefix}.stepColumns.report-only", "stepColumns", [200], body=self.body(False)
        )
        self.suite.check(
            f"{self.prefix}.stepColumns.report-only.no-actions",
            last.field("actions") == [] and last.field("stepIds") == [],
            "rows with act false get no action and no step id",
            last,
        )
        return steps

    def answered(self, answer: Any, actions: Any, ids: Any) -> bool:
        """An action in the space and a fresh step id (an integer >= 0, or -1) per row."""
        n = len(self.envs)
        shaped = isinstance(actions, list) and isinstance(ids, list)
        shaped = shaped and len(actions) == n and len(ids) == n
        if not self.suite.check(
            f"{self.prefix}.stepColumns.one-per-row",
            shaped,
            f"expected {n} actions and {n} step ids",
            answer,
        ):
            return False
        space = self.suite.act_space
        bad = [a for a in actions if not in_space(space, a)]
        self.suite.check(
            f"{self.prefix}.stepColumns.in-space",
            not bad,
            f"actions {bad[:3]} not in {space}",
            answer,
        )
        fresh = all(isinstance(i, int) and (i == -1 or i >= 0) for i in ids)
        kept = [i for i in ids if isinstance(i, int) and i >= 0]
        fresh = fresh and len(set(kept)) == len(kept)
        self.suite.check(
            f"{self.prefix}.stepColumns.step-ids",
            fresh,
            f"step ids {ids} must be distinct integers >= 0 (or -1)",
            answer,
        )
        return not bad and fresh
