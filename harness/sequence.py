"""The MISTK sequence over a run's started services (`harness.run` starts them and calls
it): orchestrator initialize -> per agent initialize, buildModel, registerAgent -> the
evaluation, game training, training or the episode blocks (startEpisode, saveEpisode,
stopEpisode) -> getResults -> agents saveModel -> reset and terminate every service. Each
step's service error is a `HarnessError` that names the step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, TypeVar

from harness.config import AgentSpec, RunConfig, RunConfigError
from harness.episodes import EpisodesFile
from harness.games import (
    GameProgress,
    check_held_out,
    evaluate,
    train_games,
    training_opponents,
)
from harness.ladder import play_round_robin, write_ladder
from harness.league import Evaluator, league_results, train_solo_league
from harness.training import (
    Checkpoints,
    Progress,
    evaluate_returns,
    restore_checkpoint,
    train,
)
from mistk_rl.sdk.client import AgentClient, OrchestratorClient, ServiceError
from mistk_rl.sdk.schemas import EpisodeConfig, Status


class HarnessError(RuntimeError):
    """A step of the run failed; the message says which and why."""


def progress_kind(config: RunConfig) -> type[Progress] | type[GameProgress]:
    """The progress.json a run of this config keeps: a game run's, or a gym run's."""
    return GameProgress if config.game_training else Progress


_Kept = TypeVar("_Kept", Progress, GameProgress)


@dataclass
class MistkSequence:
    """The MISTK sequence over a run's started services: `run` returns results.json's
    episodes, the training progress and what game training and evaluation add to the
    results ("evals", "evaluation"; a league's "league"). `evaluator`: a solo league's (its
    players are evaluated there). `local_dirs`: the data dirs of agents this harness can
    reach (it started them on this machine); `mirror`: where checkpoints are copied
    (`Checkpoints`), and restored from on resume."""

    config: RunConfig
    env: dict
    orch: OrchestratorClient
    agents: dict[str, AgentClient]
    agent_urls: dict[str, str]
    run_dir: Path
    say: Callable[[str], None]
    resume: Optional[Progress | GameProgress]
    quiet: bool
    evaluate_only: bool = False
    evaluator: Optional[Evaluator] = None
    local_dirs: dict[str, Path] = field(default_factory=dict)
    mirror: Optional[Path] = None
    episodes: Optional[EpisodesFile] = None  # the run's episodes.jsonl (`run` opens it)

    def run(self) -> tuple[Optional[EpisodesFile], Optional[Progress], dict]:
        """Set up, then evaluate, train or play the episode blocks, then evaluate at the
        end, then collect the episodes (into the run's episodes.jsonl; none for an
        evaluation, whose run dir is a training run's) and take the services down."""
        if not self.evaluate_only:
            keep = self.resume.episodes_saved if self.resume else 0
            self.episodes = EpisodesFile(self.run_dir, keep)
        self._set_up()
        outcome: dict = {}
        progress = self._main(outcome)
        if self.config.evaluation is not None and not self.evaluate_only:
            self._evaluate_at_the_end(outcome)
        if self.episodes is not None:
            with _step("getResults"):
                self.episodes.sync(self.orch)
        self._close()
        return self.episodes, progress, outcome

    def _set_up(self) -> None:
        """initialize the orchestrator; initialize, build and register every agent."""
        call_timeout = self.config.timeouts.call
        with _step("orchestrator initialize"):
            self.orch.initialize(self.env, agents_needed=len(self.agents), timeout=call_timeout)
        for spec in self.config.agents:
            agent = self.agents[spec.name]
            with _step(f"agent {spec.name} initialize"):
                agent.initialize(spec.properties, spec.hyperparameters, timeout=call_timeout)
            with _step(f"agent {spec.name} buildModel"):
                agent.build_model(self._model(spec, agent), timeout=call_timeout)
            with _step(f"registerAgent {spec.name}"):
                self.orch.register_agent(
                    spec.name,
                    self.agent_urls[spec.name],
                    skip_train=not spec.train,
                    seats=spec.seats,
                    local_inference=spec.local_inference is not None,
                )

    def _model(self, spec: AgentSpec, agent: AgentClient) -> Optional[str]:
        """What the agent builds its model from: a resumed run's checkpoint (restored
        from the mirror first, on a cluster), an evaluation's saved model, else its
        model_path."""
        checkpoint = self.resume.checkpoints.get(spec.name) if self.resume else None
        if checkpoint and self.mirror is not None and spec.target:
            restore_checkpoint(agent, self.mirror, spec.name, checkpoint, self.config.timeouts.call)
        if self.evaluate_only:
            checkpoint = (
                spec.model_path
                or saved_model(spec, self.local_dirs)
                or last_checkpoint(self.config, spec, self.run_dir, self.local_dirs)
            )
            if spec.target:
                self.say(
                    f"agent {spec.name}: "
                    + (
                        f"the model in {checkpoint}"
                        if checkpoint
                        else "untrained (no model_path, and no model saved in the run dir)"
                    )
                )
        return checkpoint or spec.model_path

    def _main(self, outcome: dict) -> Optional[Progress]:
        """The run's work: an evaluation, game training, training, a ladder or the episode
        blocks."""
        config = self.config
        if self.evaluate_only:
            with _step("evaluation"):
                outcome["evaluation"] = self._evaluation()
        elif config.game_training is not None:
            assert config.evaluation is not None  # (`RunConfig._check`: game training has one)
            trained_against = self._trained_against()
            with _step("game training"):
                outcome["evals"] = train_games(
                    self.orch,
                    config.game_training,
                    config.evaluation,
                    self.run_dir,
                    config.timeouts.episodes,
                    self.say,
                    self._checkpoints(config.game_training.checkpoints),
                    quiet=self.quiet,
                    progress=self._resumed(GameProgress),
                    title=config.name,
                    trained_against=trained_against,
                )
        elif config.training is not None:
            return self._train(outcome)
        elif config.ladder is not None:
            with _step("ladder"):
                ladder = play_round_robin(
                    self.orch, config.ladder, config.timeouts.episodes, self.say
                )
            write_ladder(ladder, self.run_dir, config.name)
            outcome["ladder"] = ladder
        else:
            _play_blocks(config, self.orch, self.say)
        return None

    def _evaluation(self) -> dict[str, Any]:
        """`mistk-rl eval`: the config's game evaluation, else its training's greedy
        episodes on the evaluation seeds."""
        config = self.config
        if config.evaluation is not None:
            return evaluate(
                self.orch, config.evaluation, config.timeouts.episodes, self._trained_against()
            )
        assert config.training is not None  # (`harness.run._save_config` refuses one of neither)
        return asdict(evaluate_returns(self.orch, config.training, config.timeouts.episodes))

    def _trained_against(self) -> frozenset[str]:
        """The evaluation's opponents the agent trains on (`training_opponents`); with
        ``evaluation.held_out``, none, or the run stops here, naming them."""
        assert self.config.evaluation is not None
        met = training_opponents(self.config, self.orch.status().payload)
        check_held_out(self.config.evaluation, met)
        trained = met & {m.opponent for m in self.config.evaluation.against}
        if trained:
            self.say(
                f"evaluation: {', '.join(sorted(trained))} also trained against "
                "(their figures are marked so; evaluation.held_out refuses this)"
            )
        return frozenset(trained)

    def _resumed(self, kind: type[_Kept]) -> Optional[_Kept]:
        """The progress this run resumes from (None: a new run), of the kind its training
        keeps (`progress_kind` loaded it)."""
        assert self.resume is None or isinstance(self.resume, kind)
        return self.resume

    def _checkpoints(self, every: Any) -> Optional[Checkpoints]:
        """Checkpoints kept as the config says (pruned where this harness can reach them)."""
        if not every:
            return None
        return Checkpoints(
            self.agents, every, self.local_dirs, self.config.timeouts.call, self.mirror
        )

    def _train(self, outcome: dict) -> Progress:
        """Single-agent training, or a solo league's (`harness.league`) with its results."""
        config, training = self.config, self.config.training
        assert training is not None
        checkpoints = self._checkpoints(training.checkpoints)
        with _step("training"):
            if self.evaluator is not None:
                progress = train_solo_league(
                    self.orch,
                    self.evaluator,
                    training,
                    self.run_dir,
                    config.timeouts.episodes,
                    self.say,
                    checkpoints,
                    self._resumed(Progress),
                    quiet=self.quiet,
                    title=config.name,
                    episodes=self.episodes,
                )
            else:
                settings = {a.name: s for a in config.agents if (s := a.settings()) is not None}
                progress = train(
                    self.orch,
                    training,
                    self.run_dir,
                    config.timeouts.episodes,
                    self.say,
                    checkpoints,
                    self._resumed(Progress),
                    quiet=self.quiet,
                    title=config.name,
                    agents=settings,
                    episodes=self.episodes,
                )
        if self.evaluator is not None:
            with _step("league results"):
                outcome["league"] = self.orch.get_league().model_dump()
        return progress

    def _evaluate_at_the_end(self, outcome: dict) -> None:
        """The config's evaluation after training: a game league's results, game
        training's last evaluation, or an evaluation run now."""
        config = self.config
        assert config.evaluation is not None
        if config.game_training is not None and config.orchestrator.env.league is not None:
            with _step("league results"):
                kept = outcome["evals"][-1].get("checkpoint") if outcome["evals"] else None
                where = self.local_dirs.get(config.evaluation.agent)
                outcome.update(
                    league_results(
                        self.orch,
                        outcome["evals"],
                        self.run_dir,
                        kept and (where / kept if where else Path(kept)),
                        title=f"{config.name} (seed {config.game_training.seed})",
                    )
                )
        elif config.game_training is not None:  # its last evaluation is the final one
            outcome["evaluation"] = outcome["evals"][-1]["evaluation"]
        else:
            with _step("evaluation"):
                outcome["evaluation"] = evaluate(
                    self.orch, config.evaluation, config.timeouts.episodes
                )

    def _close(self) -> None:
        """Save the models the config asks for; reset and terminate every service."""
        call_timeout = self.config.timeouts.call
        for spec in self.config.agents:
            if spec.save_path and not self.evaluate_only:
                with _step(f"agent {spec.name} saveModel"):
                    self.agents[spec.name].save_model(spec.save_path, timeout=call_timeout)
        with _step("reset"):
            self.orch.reset(timeout=call_timeout)  # resets the registered agents too
            if self.evaluator is not None:
                self.evaluator.client.reset(reset_agents=False, timeout=call_timeout)
                self.evaluator.client.terminate()
            for agent in self.agents.values():
                agent.terminate()
            self.orch.terminate()


def saved_model(spec: AgentSpec, local_dirs: dict[str, Path]) -> Optional[str]:
    """The save_path a run left for this agent, if the harness started it here and the file
    is there."""
    where = local_dirs.get(spec.name)
    if spec.save_path and where is not None and (where / spec.save_path).exists():
        return spec.save_path
    return None


def last_checkpoint(
    config: RunConfig, spec: AgentSpec, run_dir: Path, local_dirs: dict[str, Path]
) -> Optional[str]:
    """The checkpoint of the agent's last evaluation in the run's progress.json (a game
    run's or a gym run's, as `config` says), if the harness started the agent here and the
    file is there."""
    where = local_dirs.get(spec.name)
    try:
        checkpoint = progress_kind(config).load(run_dir).checkpoints.get(spec.name)
    except (RunConfigError, TypeError):  # (no progress.json; one of another kind of run)
        return None
    if checkpoint and where is not None and (where / checkpoint).exists():
        return checkpoint
    return None


def _play_blocks(config: RunConfig, orch: OrchestratorClient, say: Callable[[str], None]) -> None:
    printed = 0

    def show_new_episodes(status: Status) -> None:
        """Print each episode as it finishes (the wait's long-polls bring the news)."""
        nonlocal printed
        if status.payload.get("episodesDone", 0) > printed:
            for episode in orch.get_results(since=printed).episodes:
                say(
                    f"  episode {episode.episode:4d}  agent {episode.agent}  "
                    f"return {episode.return_:9.2f}  length {episode.length}"
                )
                printed += 1

    assert config.episodes is not None  # (`RunConfig._check`: one block by default)
    for i, block in enumerate(config.episodes):
        episode_config = EpisodeConfig(
            num_episodes=block.num_episodes,
            seed=block.seed,
            max_steps=block.max_steps,
            train=block.train,
        )
        with _step(f"episode block {i} startEpisode"):
            orch.start_episode(
                episode_config,
                wait=True,
                timeout=config.timeouts.episodes,
                on_status=show_new_episodes,
            )
        if block.save_path:
            with _step(f"episode block {i} saveEpisode"):
                orch.save_episode(block.save_path)
        with _step(f"episode block {i} stopEpisode"):
            orch.stop_episode()


class _step:
    """Turn any service error inside a step into a HarnessError naming the step."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, _exc_type: object, exc: Optional[BaseException], _tb: object
    ) -> Literal[False]:
        if exc is not None and isinstance(exc, ServiceError):
            raise HarnessError(f"{self.name} failed: {exc}") from exc
        return False
