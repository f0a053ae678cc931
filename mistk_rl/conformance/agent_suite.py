"""The agent's checks: the kit plays the orchestrator, with a gymnasium env of its own
(CartPole-v1 unless told otherwise), and walks the agent through its lifecycle.

In each resting state (started, initialized, ready, in_episode) it checks what the table
implies (`Suite.check_state`), bad input, and then drives real episodes three ways: getAction
with replayAction, step, and (capability ``columns``) stepColumns over several env copies;
the step stream and the policy copy when the agent lists ``stream`` and ``local``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np

from mistk_rl.conformance.columns import ColumnEpisode
from mistk_rl.conformance.probe import Reply
from mistk_rl.conformance.stream import check_step_stream
from mistk_rl.conformance.suite import CallArgs, Suite
from mistk_rl.conformance.values import in_space, json_value, outside
from mistk_rl.lifecycle.tables import AGENT
from mistk_rl.spaces import space_to_dict

NAME = "conformance"  # the entity the kit plays
COPIES = 4  # env copies of the columnar episodes
MAX_STEPS = 600  # steps of any one episode the kit plays (CartPole ends by 500)


class AgentSuite(Suite):
    role = "agent"
    table = AGENT

    def __init__(self, url: str, *, env: str = "CartPole-v1", seed: int = 0, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.env_id, self.seed = env, seed
        self.envs = [gym.make(env) for _ in range(COPIES)]
        self.obs_space = self.envs[0].observation_space
        self.act_space = self.envs[0].action_space
        self.first_obs = self.envs[0].reset(seed=seed)[0]

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # ---- a valid call of each operation, for the refusals --------------------------------
    def calls(self) -> dict[str, Callable[[], CallArgs]]:
        obs = {NAME: json_value(self.first_obs)}
        action = json_value(self.act_space.sample())
        replay = {
            "prevObs": obs,
            "actions": {NAME: action},
            "rewards": {NAME: 1.0},
            "newObs": obs,
            "terminated": {NAME: False},
        }
        table: dict[str, Callable[[], CallArgs]] = {
            "initialize": lambda: {"body": {}},
            "buildModel": lambda: {},
            "saveModel": lambda: {"params": {"modelPath": "conformance/refused"}},
            "agentRegistered": lambda: {"body": self.registration()},
            "episodeStarted": lambda: {"body": {"obs": obs}},
            "getAction": lambda: {"body": {"obs": obs}},
            "replayAction": lambda: {"body": replay},
            "step": lambda: {"body": {"obs": obs}},
            "episodeStopped": lambda: {},
        }
        if "columns" in self.capabilities:
            table["stepColumns"] = lambda: {"body": {"envs": [0], "obs": [obs[NAME]]}}
        return table

    def registration(self) -> dict[str, Any]:
        return {
            "name": NAME,
            "observationSpace": space_to_dict(self.obs_space),
            "actionSpace": space_to_dict(self.act_space),
        }

    # ---- the walk ------------------------------------------------------------------------
    def scenario(self) -> None:
        if not self.opened():
            return
        self.check_initialize()
        self.check_registration()
        if self.state() != "ready":
            return
        self.check_state("ready", self.calls())
        self.check_model_files()
        self.check_long_poll("ready", self.start_episode)
        if self.state() == "in_episode":
            self.check_in_episode()
        self.play("entities", self.entity_steps)
        self.play("step", self.one_call_steps)
        if "columns" in self.capabilities:
            self.play("columns", self.column_steps)
        if "stream" in self.capabilities:
            self.check_stream()
        if "local" in self.capabilities:
            self.check_policy_copy()
        self.check_resets()
        self.check_files(self.state() or "")
        if self.terminate_at_end:
            self.check_terminate(self.calls())

    def check_initialize(self) -> None:
        self.bad_input(
            "started.initialize.bad-input", "initialize", "started", body={"unknownField": 1}
        )
        self.bad_input(
            "started.initialize.not-json",
            "initialize",
            "started",
            raw=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        self.expect("started.initialize.answers", "initialize", [202], body={})
        if self.settle("started.initialize.settles", "initialized") != "initialized":
            return
        self.check_state("initialized", self.calls())
        self.expect("initialized.buildModel.answers", "buildModel", [202])
        self.settle("initialized.buildModel.settles", "initialized")

    def check_registration(self) -> None:
        bad = {**self.registration(), "name": "not a name!"}
        self.bad_input(
            "initialized.agentRegistered.bad-name", "agentRegistered", "initialized", body=bad
        )
        bad = {**self.registration(), "actionSpace": {"type": "Nonsense"}}
        self.bad_input(
            "initialized.agentRegistered.bad-space", "agentRegistered", "initialized", body=bad
        )
        self.expect(
            "initialized.agentRegistered.answers",
            "agentRegistered",
            [200],
            body=self.registration(),
        )
        self.settle("initialized.agentRegistered.settles", "ready")

    def check_model_files(self) -> None:
        """saveModel and buildModel from what it saved, both leaving the agent registered."""
        self.bad_input("ready.saveModel.no-path", "saveModel", "ready")
        self.bad_input(
            "ready.buildModel.outside", "buildModel", "ready", params={"modelPath": "../../x"}
        )
        path = {"modelPath": "conformance/model"}
        self.expect("ready.saveModel.answers", "saveModel", [202], params=path)
        if self.settle("ready.saveModel.settles", "ready") == "ready":
            self.expect("ready.buildModel.answers", "buildModel", [202], params=path)
            self.settle("ready.buildModel.settles", "ready")

    def start_episode(self, obs: Optional[Any] = None, prefix: str = "ready") -> Reply:
        obs = self.first_obs if obs is None else obs
        bad_obs = {NAME: json_value(np.zeros(np.asarray(obs).size + 3))}
        if prefix == "ready":
            self.bad_input(
                "ready.episodeStarted.bad-obs", "episodeStarted", "ready", body={"obs": bad_obs}
            )
        return self.expect(
            f"{prefix}.episodeStarted.answers",
            "episodeStarted",
            [200],
            body={"obs": {NAME: json_value(obs)}, "mode": "collect"},
        )

    def check_in_episode(self) -> None:
        self.check_state("in_episode", self.calls())
        obs = {NAME: json_value(self.first_obs)}
        wrong = {NAME: json_value(np.zeros(np.asarray(self.first_obs).size + 3))}
        bad: list[tuple[str, str, CallArgs]] = [
            ("getAction.wrong-shape", "getAction", {"body": {"obs": wrong}}),
            ("getAction.no-entities", "getAction", {"body": {"obs": {}}}),
            ("getAction.unknown-field", "getAction", {"body": {"obs": obs, "nope": 1}}),
            (
                "getAction.not-json",
                "getAction",
                {"raw": b"[1,", "headers": {"Content-Type": "application/json"}},
            ),
            (
                "getAction.content-type",
                "getAction",
                {"raw": b"obs", "headers": {"Content-Type": "text/plain"}},
            ),
            ("replayAction.action-outside", "replayAction", {"body": self.bad_replay(obs)}),
        ]
        if "columns" in self.capabilities:
            row = obs[NAME]
            bad += [
                (
                    "stepColumns.repeated-env",
                    "stepColumns",
                    {"body": {"envs": [0, 0], "obs": [row, row]}},
                ),
                (
                    "stepColumns.unknown-step",
                    "stepColumns",
                    {
                        "body": {
                            "envs": [0],
                            "obs": [row],
                            "stepIds": [987654321],
                            "rewards": [0.0],
                            "terminated": [False],
                        }
                    },
                ),
                (
                    "stepColumns.rows-disagree",
                    "stepColumns",
                    {"body": {"envs": [0, 1], "obs": [row]}},
                ),
            ]
        for name, operation_id, args in bad:
            self.bad_input(f"in_episode.{name}", operation_id, "in_episode", **args)
        self.expect("in_episode.episodeStopped.answers", "episodeStopped", [200])
        self.settle("in_episode.episodeStopped.settles", "ready")

    def bad_replay(self, obs: dict[str, Any]) -> dict[str, Any]:
        action = outside(self.act_space)
        return {
            "prevObs": obs,
            "actions": {NAME: action},
            "rewards": {NAME: 1.0},
            "newObs": obs,
            "terminated": {NAME: False},
        }

    # ---- episodes ------------------------------------------------------------------------
    def play(self, how: str, steps: Callable[[str], Optional[int]]) -> None:
        """One episode (several env copies for columns) from ready back to ready."""
        if self.state() != "ready":
            return
        obs = [env.reset(seed=self.seed + i)[0] for i, env in enumerate(self.envs)]
        if self.start_episode(obs[0], prefix=f"episode.{how}").status != 200:
            return
        self.obs = obs
        played = steps(f"episode.{how}")
        if played is not None:
            self.check(
                f"episode.{how}.ends",
                0 < played < MAX_STEPS * COPIES,
                f"the env ran {played} steps without ending the episode",
            )
        self.expect(f"episode.{how}.episodeStopped", "episodeStopped", [200])
        self.settle(f"episode.{how}.ready-again", "ready")

    def action_of(self, name: str, answer: Reply) -> Optional[Any]:
        actions = answer.field("actions")
        action = actions.get(NAME) if isinstance(actions, dict) else None
        ok = action is not None and in_space(self.act_space, action)
        self.check(name, ok, f"action {action!r} is not in {self.act_space}", answer)
        return action if ok else None

    def entity_steps(self, prefix: str) -> Optional[int]:
        """getAction, then replayAction with the outcome, until the episode ends."""
        env, obs = self.envs[0], self.obs[0]
        for t in range(MAX_STEPS):
            answer = self.expect(
                f"{prefix}.getAction", "getAction", [200], body={"obs": {NAME: json_value(obs)}}
            )
            action = self.action_of(f"{prefix}.getAction.in-space", answer)
            if action is None:
                return None
            new_obs, reward, term, trunc, _ = env.step(np.asarray(action, self.act_space.dtype))
            replay = _replay(obs, action, float(reward), new_obs, term, trunc)
            if (
                self.expect(f"{prefix}.replayAction", "replayAction", [200], body=replay).status
                != 200
            ):
                return None
            obs = new_obs
            if term or trunc:
                return t + 1
        return MAX_STEPS

    def one_call_steps(self, prefix: str) -> Optional[int]:
        """step: each call reports the last transition and asks for the next action."""
        env, obs, replay = self.envs[0], self.obs[0], None
        for t in range(MAX_STEPS):
            body: dict[str, Any] = {"obs": {NAME: json_value(obs)}}
            if replay is not None:
                body["replay"] = replay
            answer = self.expect(f"{prefix}.step", "step", [200], body=body)
            action = self.action_of(f"{prefix}.step.in-space", answer)
            if action is None:
                return None
            new_obs, reward, term, trunc, _ = env.step(np.asarray(action, self.act_space.dtype))
            replay = _replay(obs, action, float(reward), new_obs, term, trunc)
            obs = new_obs
            if term or trunc:
                done = self.expect(f"{prefix}.replayAction", "replayAction", [200], body=replay)
                return t + 1 if done.status == 200 else None
        return MAX_STEPS

    def column_steps(self, prefix: str) -> Optional[int]:
        """stepColumns over the env copies until each has ended an episode; the outcome of
        each step is reported on its row, the copies that ended act on their reset."""
        return ColumnEpisode(self, prefix).play()

    # ---- optional capabilities -----------------------------------------------------------
    def check_stream(self) -> None:
        check_step_stream(self)

    def check_policy_copy(self) -> None:
        answer = self.expect(
            "local.getPolicy.answers", "getPolicy", [200], params={"weights": False}
        )
        self.check(
            "local.getPolicy.spaces",
            answer.field("actionSpace") == space_to_dict(self.act_space),
            f"actionSpace {answer.field('actionSpace')!r} is not the one registered",
            answer,
        )

    def check_resets(self) -> None:
        """reset from an episode (preempting it) to started; with unloadModel false from
        initialized back to initialized."""
        if self.state() == "ready" and self.start_episode(prefix="reset").status == 200:
            self.expect("in_episode.reset.answers", "reset", [202])
            self.settle("in_episode.reset.settles", "started")
        if self.state() != "started":
            return
        self.expect("reset.initialize", "initialize", [202], body={})
        if self.settle("reset.initialize.settles", "initialized") == "initialized":
            self.expect(
                "initialized.reset.keep-model", "reset", [202], params={"unloadModel": False}
            )
            self.settle("initialized.reset.keep-model.settles", "initialized")


def _replay(obs: Any, action: Any, reward: float, new_obs: Any, term: bool, trunc: bool) -> dict:
    return {
        "prevObs": {NAME: json_value(obs)},
        "actions": {NAME: json_value(action)},
        "rewards": {NAME: reward},
        "newObs": {NAME: json_value(new_obs)},
        "terminated": {NAME: bool(term)},
        "truncated": {NAME: bool(trunc)},
    }
