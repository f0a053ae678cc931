"""The orchestrator's checks: the kit serves an agent of its own (`PairAgent`, on a free
loopback port, or one at `agent_url`), registers it, and walks the orchestrator through its
lifecycle: uninitialized, waiting_for_agents, ready, running (a long run, stopped),
completed_episode; the results are compared with what its agent was made to do."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from mistk_rl.conformance.probe import Reply
from mistk_rl.conformance.suite import CallArgs, Suite
from mistk_rl.deploy.launch import ServiceProcess, spawn_service, wait_ready
from mistk_rl.lifecycle.tables import ORCHESTRATOR
from mistk_rl.sdk.client import AgentClient, ServiceError

PAIR = "mistk_rl.conformance.pair:PairAgent"
NAME = "conformance"
EPISODES = 2


class OrchestratorSuite(Suite):
    role = "orchestrator"
    table = ORCHESTRATOR

    def __init__(
        self, url: str, *, env: str = "CartPole-v1", agent_url: Optional[str] = None, **kw: Any
    ) -> None:
        super().__init__(url, **kw)
        self.env_id = env
        self._dir = tempfile.TemporaryDirectory(prefix="mistk-rl-conformance-")
        self.pair: Optional[ServiceProcess] = None
        if agent_url is None:  # (started now, so it boots while the first checks run)
            self.pair = spawn_service(
                "agent",
                PAIR,
                data_dir=Path(self._dir.name) / "agent",
                log_path=Path(self._dir.name) / "agent.log",
                token=self.token,
            )
            agent_url = self.pair.url
        self.agent_url = agent_url.rstrip("/")
        self.agent = AgentClient(self.agent_url, token=self.token, timeout=self.probe.timeout)

    def close(self) -> None:
        self.agent.close()
        if self.pair is not None:
            self.pair.stop()
        self._dir.cleanup()

    def calls(self) -> dict[str, Callable[[], CallArgs]]:
        return {
            "initialize": lambda: {"body": {"env": {"id": self.env_id}}},
            # (another name: the refusal must be for the state, not for a name taken)
            "registerAgent": lambda: {
                "params": {"agentName": f"{NAME}-2", "agentUrl": self.agent_url}
            },
            "startEpisode": lambda: {"body": {"numEpisodes": 1}},
            "saveEpisode": lambda: {"params": {"path": "conformance/refused.json"}},
            "stopEpisode": lambda: {},
        }

    # ---- the walk ------------------------------------------------------------------------
    def scenario(self) -> None:
        if not self.opened():
            return
        self.check_initialize()
        if self.state() != "waiting_for_agents":
            return
        self.check_state("waiting_for_agents", self.calls())
        self.check_registration()
        if self.state() != "ready":
            return
        self.check_state("ready", self.calls())
        self.check_episodes()
        if self.state() == "ready":
            self.check_long_poll("ready", self.start_long_run)
            self.check_running()
        self.check_reset()
        self.check_files(self.state() or "")
        if self.terminate_at_end:
            self.check_terminate(self.calls())

    def check_initialize(self) -> None:
        for name, body in (
            ("no-env", {}),
            ("unknown-field", {"env": {"id": self.env_id}, "nope": 1}),
            ("unknown-env", {"env": {"id": "NoSuchEnv-v0"}}),
        ):
            self.bad_input(
                f"uninitialized.initialize.{name}", "initialize", "uninitialized", body=body
            )
        self.expect(
            "uninitialized.initialize.answers",
            "initialize",
            [202],
            body={"env": {"id": self.env_id}, "agentsNeeded": 1},
        )
        self.settle("uninitialized.initialize.settles", "waiting_for_agents")

    def check_registration(self) -> None:
        state = "waiting_for_agents"
        self.bad_input(
            f"{state}.registerAgent.bad-name",
            "registerAgent",
            state,
            params={"agentName": "not a name!", "agentUrl": self.agent_url},
        )
        self.bad_input(
            f"{state}.registerAgent.nobody-there",
            "registerAgent",
            state,
            params={"agentName": NAME, "agentUrl": "http://127.0.0.1:9"},
        )
        if self.pair is not None:
            wait_ready(self.pair, self.wait_s)
        self.agent.initialize(wait=True, timeout=self.wait_s)
        self.agent.build_model(wait=True, timeout=self.wait_s)
        self.expect(
            f"{state}.registerAgent.answers",
            "registerAgent",
            [200],
            params={"agentName": NAME, "agentUrl": self.agent_url},
        )
        self.settle(f"{state}.registerAgent.settles", "ready")
        told = self.agent.status()
        self.check(
            f"{state}.registerAgent.told-the-agent",
            told.state == "ready",
            f"the agent was not registered (it is {told.state!r}): agentRegistered not called",
        )

    def check_episodes(self) -> None:
        for name, body in (("zero-episodes", {"numEpisodes": 0}), ("unknown-option", {"nope": 1})):
            self.bad_input(f"ready.startEpisode.{name}", "startEpisode", "ready", body=body)
        before = self.agent.status().payload
        self.expect(
            "ready.startEpisode.answers",
            "startEpisode",
            [202],
            body={"numEpisodes": EPISODES, "seed": 0},
        )
        if self.settle("running.settles", "completed_episode") != "completed_episode":
            return
        results = self.expect("completed_episode.getResults", "getResults", [200])
        episodes = results.field("episodes") or []
        self.check(
            "completed_episode.getResults.episodes",
            len(episodes) == EPISODES,
            f"{len(episodes)} episodes in the results, {EPISODES} asked for",
            results,
        )
        self.check_agent_drove(before, episodes, results)
        later = self.expect(
            "completed_episode.getResults.since", "getResults", [200], params={"since": 1}
        )
        self.check(
            "completed_episode.getResults.since-1",
            len(later.field("episodes") or []) == EPISODES - 1,
            "results?since=1 must leave out the first episode",
            later,
        )
        page = self.expect(
            "completed_episode.getResults.limit",
            "getResults",
            [200],
            params={"since": 1, "limit": 1},
        )
        self.check(
            "completed_episode.getResults.since-1-limit-1",
            [e.get("episode") for e in page.field("episodes") or []] == [1],
            "results?since=1&limit=1 must hold episode 1 only",
            page,
        )
        self.check_state("completed_episode", self.calls())
        self.expect(
            "completed_episode.saveEpisode",
            "saveEpisode",
            [200],
            params={"path": "conformance/episodes.json"},
        )
        self.expect("completed_episode.stopEpisode", "stopEpisode", [200])
        self.settle("completed_episode.stopEpisode.settles", "ready")

    def check_agent_drove(self, before: dict, episodes: list, results: Reply) -> None:
        """The episodes the results list are the ones the agent played: started and
        stopped around them (the agent back in ready), an action per step."""
        status = self.agent.status()
        after = status.payload
        started = after.get("episodesStarted", 0) - before.get("episodesStarted", 0)
        stopped = after.get("episodesStopped", 0) - before.get("episodesStopped", 0)
        acted = after.get("actions", 0) - before.get("actions", 0)
        steps = sum(int(e.get("length", 0)) for e in episodes if isinstance(e, dict))
        self.check(
            "episodes.agent-started-and-stopped",
            started >= 1 and stopped == started and status.state == "ready",
            f"the agent got episodeStarted {started} and episodeStopped {stopped} times, "
            f"and is {status.state!r} (ready expected) once the episodes completed",
            results,
        )
        self.check(
            "episodes.agent-acted-each-step",
            steps <= acted <= steps + 1,
            f"the agent acted {acted} times in episodes of {steps} steps in all",
            results,
        )

    def start_long_run(self) -> Reply:
        return self.expect(
            "ready.startEpisode.long-run", "startEpisode", [202], body={"numEpisodes": 100000}
        )

    def check_running(self) -> None:
        """While episodes run: status says running, every operation but stopEpisode,
        reset and terminate is refused; stopEpisode ends the run."""
        if self.state() != "running":
            self.check("running.reached", False, f"the long run is {self.state()!r}")
            return
        self.check_state("running", self.calls())
        self.expect("running.stopEpisode.answers", "stopEpisode", [200])
        self.settle("running.stopEpisode.settles", "ready")

    def check_reset(self) -> None:
        self.expect("reset.from-ready", "reset", [202])
        self.settle("reset.from-ready.settles", "uninitialized")
        try:
            done = ("started", "initialized")  # (reset with or without its model)
            agent = self.agent.wait_for_state(done, timeout=self.wait_s).state
        except ServiceError as exc:
            agent = f"{type(exc).__name__}: {exc}"
        self.check(
            "reset.resets-the-agents",
            agent in done,
            f"the registered agent is {agent!r} after reset, not started or initialized",
        )
