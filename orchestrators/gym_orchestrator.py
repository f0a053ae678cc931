"""GymOrchestrator: plays any single-agent gymnasium env, as `numEnvs` copies, against one
registered agent.

One startEpisode is one agent episode (episodeStarted ... episodeStopped) in which the env
copies run their own episodes and reset themselves. Every step sends all ready copies'
observations in one request (columns, or entity ``name`` for one copy and ``name:i`` for
several; with ``pipelineDepth`` 2, two requests in flight for two halves of the copies:
`mistk_rl.sdk.stepping`), so the agent answers with one batched forward pass; the previous
steps' outcomes ride along in the same request. Per-env accounting records each finished
episode exactly once. Env copies live in an env manager (``envManager``: base, subprocess,
async, or ray: actors on the cluster, placed as ``env.envWorkers`` says) that supervises
them: a copy that raises, dies or hangs is restarted, its episode is recorded as abnormal,
and the others go on.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import gymnasium as gym
import numpy as np

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.implementation import PROGRESS_EVERY_S, Metric
from mistk_rl.framework.orchestrator import AbstractOrchestrator, RegisteredAgent, episode_quotas
from mistk_rl.rl.envs import ALL_MANAGERS, EnvManager, Timestep, make_env_fns
from mistk_rl.rl.envs.base import EnvFn
from mistk_rl.rl.envs.ray_workers import join_cluster
from mistk_rl.sdk.client import ServiceError, ServiceUnavailable
from mistk_rl.sdk.schemas import EpisodeSettings, GymEnvSpec, GymEpisodeSettings
from mistk_rl.sdk.stepping import StepOutcome, Stepper, stepper_for
from mistk_rl.spaces import SUPPORTED, coerce_action, space_to_dict
from mistk_rl.thinker.gym_env import ThinkerEnvFactory

# When requests use the binary encoding (`binary_for`). Measured with `mistk-rl bench
# transport` (CartPole, 16 observation bytes per copy): the entity form is faster binary
# from 16 copies. stepColumns' codec costs ~35 us a request whatever its size (its fixed cost
# per array: 12 us to encode a step of 64 copies, 15 to decode it, 10 for the answer), JSON
# a microsecond per copy and growing (60 us at 64 copies); they cross near 32 copies (512
# bytes of observations a request). Larger observations (images) go binary from one copy.
BINARY_FROM_ENVS = 8
BINARY_FROM_BYTES = 512


def binary_for(
    capabilities: frozenset[str],
    observation_space: gym.Space,
    num_envs: int,
    depth: int = 1,
    local: bool = False,
) -> bool:
    """Whether an agent's requests use the binary encoding (it must list ``tensors``):
    local inference's batches of experience and weights always; stepColumns once one
    request's observations (numEnvs / depth copies) reach `BINARY_FROM_BYTES`; the entity
    form from `BINARY_FROM_ENVS` copies."""
    if "tensors" not in capabilities:
        return False
    if local:
        return True
    if "columns" in capabilities:
        rows = -(-num_envs // depth)
        return rows * _obs_bytes(observation_space) >= BINARY_FROM_BYTES
    return num_envs >= BINARY_FROM_ENVS


def _obs_bytes(space: gym.Space) -> int:
    """Bytes of one observation as arrays (a Dict space: all its keys)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(_obs_bytes(sub) for sub in space.spaces.values())
    shape = space.shape or ()
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(space.dtype or np.float32).itemsize


@dataclass
class _Running:
    """One env copy's episode in progress."""

    seed: Optional[int] = None
    episode_return: float = 0.0
    length: int = 0


@dataclass
class _Carried:
    """Episodes a `resume` run left in progress, for the next one on the same manager."""

    manager: EnvManager
    running: dict[int, _Running]
    stepper: Stepper  # the actions still in flight (async managers), with their step ids


@dataclass
class _EpisodeRun:
    """One startEpisode's state: the copies still playing, what each has finished of its
    quota, the outcomes the next step reports, and whether the step budget cut it."""

    config: GymEpisodeSettings
    agent: RegisteredAgent
    manager: EnvManager
    stepper: Stepper
    learn: bool
    running: dict[int, _Running]
    quotas: list[float]  # episodes each copy plays (inf: no limit)
    start_steps: int  # the orchestrator's env steps when it began
    active: set[int] = field(default_factory=set)
    outcomes: dict[int, StepOutcome] = field(default_factory=dict)  # env -> its last step's
    finished: list[int] = field(default_factory=list)
    cut: bool = False  # resume: the step budget ran out with episodes in progress

    def __post_init__(self) -> None:
        self.finished = [0] * self.manager.env_num

    def entity(self, i: int) -> str:
        """Copy i's entity name: the agent's own with one copy, else ``<agent>:<i>``."""
        return self.agent.name if self.manager.env_num == 1 else f"{self.agent.name}:{i}"

    def budget_spent(self, env_steps: int) -> bool:
        return (
            self.config.num_steps is not None
            and env_steps - self.start_steps >= self.config.num_steps
        )


class GymOrchestrator(AbstractOrchestrator):
    env_settings = GymEnvSpec
    episode_settings = GymEpisodeSettings
    local_inference = True

    def __init__(self) -> None:
        super().__init__()
        self.env_spec: dict[str, Any] = {}
        self.observation_space: Optional[gym.Space] = None
        self.action_space: Optional[gym.Space] = None
        # one manager per (numEnvs, envManager, stepTimeout): a training run that alternates
        # 1-env training and 10-env evaluation keeps both sets of env copies alive
        self.managers: dict[tuple, EnvManager] = {}
        self._restarts_before = 0  # env restarts counted by managers since replaced
        self._carried: dict[tuple, _Carried] = {}  # manager key -> what `resume` left running

    def validate_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        super().validate_initialize(env, agents_needed)
        if agents_needed != 1:
            raise InvalidRequest(
                "GymOrchestrator plays single-agent envs: agentsNeeded "
                f"must be 1, not {agents_needed}"
            )
        probe_env(env, self.env_modules)

    def validate_start_episode(self, config: EpisodeSettings) -> None:
        assert isinstance(config, GymEpisodeSettings)  # (the service parses `episode_settings`)
        if config.pipeline_depth > 1:
            self._check_pipeline(config)
        if config.env_manager == "ray" and _key(config) not in self.managers:
            try:  # (joins once: later calls find the process connected)
                join_cluster()
            except RuntimeError as exc:
                raise InvalidRequest(f"envManager ray: {exc}") from exc
        if config.env_kwargs:  # bad kwargs: 400 now, not a failed service later
            _probe({**self.env_spec, "kwargs": self._kwargs(config)})
        if config.env_manager == "base" or _key(config) in self.managers:
            return
        running = sum(m.env_num for k, m in self.managers.items() if k[1] != "base")
        self.limits.check(
            "max_env_processes",
            running + config.num_envs,
            f"env worker processes (the {running} running and numEnvs {config.num_envs} more)",
        )

    def _check_pipeline(self, config: GymEpisodeSettings) -> None:
        """pipelineDepth > 1 needs env copies to share out and a columnar step to pipeline."""
        depth = config.pipeline_depth
        if depth > config.num_envs:
            raise InvalidRequest(
                f"pipelineDepth {depth} is more than numEnvs "
                f"{config.num_envs}: each request in flight needs env "
                "copies of its own"
            )
        for agent in self.agents.values():
            if "columns" not in agent.capabilities:
                raise InvalidRequest(
                    f"pipelineDepth {depth}: agent {agent.name!r} does not "
                    "take stepColumns (capability 'columns'), the step "
                    "that is pipelined"
                )
            if self.local_inference_settings(config, agent) is not None:
                raise InvalidRequest(
                    f"pipelineDepth {depth}: agent {agent.name!r} acts "
                    "with localInference, which sends no step requests"
                )

    def do_initialize(self, env: dict[str, Any], agents_needed: int) -> None:
        self._close_managers()
        self.observation_space, self.action_space = _probe(env)
        self.env_spec = env

    def agent_config(self, name: str, seats: tuple[str, ...] = ()) -> dict[str, Any]:
        observation_space, action_space = self._spaces()
        return {
            "observationSpace": space_to_dict(observation_space),
            "actionSpace": space_to_dict(action_space),
        }

    def _spaces(self) -> tuple[gym.Space, gym.Space]:
        """The env's (observation, action) spaces, which initialize probed."""
        if self.observation_space is None or self.action_space is None:
            raise RuntimeError("no env spaces: initialize the orchestrator first")
        return self.observation_space, self.action_space

    # ---- running episodes ------------------------------------------------------------------
    def do_start_episode(self, config: EpisodeSettings) -> None:
        """Step the env copies until each has played its quota of episodes (or the step
        budget is spent, or a stop comes). The hops: `_begin` (the manager, the episodes a
        `resume` run carried over or fresh ones, the stepper), `_step_once` and
        `_took_step` (one round over the ready copies: quotas, the per-episode step cap,
        the budget), `_end` (what a cut or a stop leaves), `_episode_stopped`."""
        assert isinstance(config, GymEpisodeSettings)  # (the service parses `episode_settings`)
        run = self._begin(config)
        ending: Optional[BaseException] = None  # the error that ended the run, if one did
        try:
            while run.active and not self.should_stop and not run.cut:
                self._step_once(run)
                self._report(every_s=PROGRESS_EVERY_S)
            self._end(run)
        except BaseException as exc:
            ending = exc
            raise
        finally:
            self._report()
            self._episode_stopped(run.agent, ending)

    def _begin(self, config: GymEpisodeSettings) -> _EpisodeRun:
        """The episodes to play, and the agent told they start."""
        (agent,) = self.agents.values()
        manager = self._manager(config)
        n = manager.env_num
        local = self.local_inference_settings(config, agent)
        mode, learn = self.play_settings(config, agent)
        agent.client.binary = binary_for(
            agent.capabilities, self._spaces()[0], n, config.pipeline_depth, local is not None
        )
        live = [i for i in range(n) if i not in manager.retired]
        carried = self._carried.pop(_key(config), None)
        if config.resume and carried is not None and carried.manager is manager:
            running = {i: carried.running.get(i, _Running()) for i in live}
            stepper = carried.stepper
        else:
            seeds = {i: None if config.seed is None else config.seed + i for i in live}
            manager.reset(live, seeds=seeds)
            running = {i: _Running(seeds[i]) for i in live}
            stepper = stepper_for(
                agent.client,
                agent.capabilities,
                agent.name,
                n,
                local,
                mode=mode,
                learn=learn,
                epsilon=self.exploration(config, agent),
                depth=config.pipeline_depth,
            )
        quotas = episode_quotas(config.episode_limit(), n)
        run = _EpisodeRun(config, agent, manager, stepper, learn, running, quotas, self.env_steps)
        run.active = {i for i in live if quotas[i] > 0}
        ready = {i: obs for i, obs in manager.ready_obs.items() if i in run.active}
        agent.client.episode_started(
            {run.entity(i): o for i, o in ready.items()},
            mode=mode,
            action_mask=_entity_masks(_masks(manager, ready), run.entity),
            episode=len(self.results),
            epsilon=self.exploration(config, agent),
        )
        return run

    def _step_once(self, run: _EpisodeRun) -> None:
        """Actions for the ready copies (reporting their last outcomes), and their steps."""
        manager = run.manager
        ready = {i: obs for i, obs in manager.ready_obs.items() if i in run.active}
        # (async managers: all may still be in flight; the outcomes then wait)
        actions = run.stepper.step(ready, run.outcomes, _masks(manager, ready)) if ready else {}
        if ready:
            run.outcomes = {}
        # (a pipelined stepper answers part of the ready copies at a time)
        space = self._spaces()[1]
        timesteps = manager.step(
            {i: coerce_action(space, a) for i, a in actions.items() if i in ready}
        )
        to_reset = [i for i, ts in timesteps.items() if self._took_step(run, i, ts)]
        if to_reset:
            manager.reset(to_reset)
        run.cut = run.config.resume and run.budget_spent(self.env_steps)

    def _took_step(self, run: _EpisodeRun, i: int, ts: Timestep) -> bool:
        """Count copy `i`'s step, and end its episode where the env, the step cap or a fault
        does; True when the copy needs a reset (capped, the env has not ended it)."""
        config, episode = run.config, run.running[i]
        episode.episode_return += ts.reward
        real = ts.info.get("real_step", True)  # (the Thinker MDP's imagination
        episode.length += real  # is not an env step)
        self.env_steps += real
        capped = real and config.max_steps is not None and episode.length >= config.max_steps
        if run.learn:
            run.outcomes[i] = _outcome(ts, truncated=capped)
        if not (ts.done or capped or ts.abnormal):
            return False
        self._finish(run.agent.name, i, episode, ts, capped, run.learn)
        run.running[i] = _Running()
        run.finished[i] += 1
        if (
            run.budget_spent(self.env_steps)
            or run.finished[i] >= run.quotas[i]
            or i in run.manager.retired
        ):
            run.active.discard(i)
        return bool(capped and not ts.done and not ts.abnormal)

    def _end(self, run: _EpisodeRun) -> None:
        """The last outcomes, which no next step carried (and local inference's experience
        not sent yet); then the episodes in progress kept for the next resume run (a cut),
        or recorded as cancelled (a stop)."""
        run.stepper.step({}, run.outcomes)
        if run.cut and not self.should_stop:
            self._carried[_key(run.config)] = _Carried(
                run.manager, {i: run.running[i] for i in run.active}, run.stepper
            )
        elif self.should_stop:
            for i in sorted(run.active):
                episode = run.running[i]
                if episode.length:
                    self.record_episode(
                        run.agent.name,
                        episode.episode_return,
                        episode.length,
                        seed=episode.seed,
                        cancelled=True,
                        train=run.learn,
                        envIndex=i,
                    )

    @staticmethod
    def _episode_stopped(agent: RegisteredAgent, ending: Optional[BaseException]) -> None:
        """Tell the agent the episodes ended, unless it is the agent that stopped answering;
        its refusal is the news only when nothing else ended the run."""
        if isinstance(ending, ServiceUnavailable):
            return
        try:
            agent.client.episode_stopped()
        except ServiceError:
            if ending is None:
                raise

    def _restarts(self) -> int:
        return self._restarts_before + sum(m.stats["restarts"] for m in self.managers.values())

    def _report(self, every_s: float = 0.0) -> None:
        self.update_status({"envSteps": self.env_steps, "envRestarts": self._restarts()}, every_s)

    def metrics(self) -> list[Metric]:
        return [
            *super().metrics(),
            Metric(
                "env_restarts_total",
                "counter",
                "Env copies restarted by their manager after a crash or a hang",
                self._restarts(),
            ),
        ]

    def _finish(
        self, name: str, i: int, episode: _Running, ts: Timestep, capped: bool, learn: bool
    ) -> None:
        self.record_episode(
            name,
            episode.episode_return,
            episode.length,
            seed=episode.seed,
            terminated=ts.terminated and not ts.abnormal,
            truncated=(ts.truncated or capped) and not ts.abnormal,
            abnormal=ts.abnormal,
            cancelled=False,
            train=learn,
            envIndex=i,
        )

    def _manager(self, config: GymEpisodeSettings) -> EnvManager:
        """The env manager for this config, kept across startEpisode calls with the same
        number of envs, kind, timeout and train flag (until it is done: all its envs
        retired). Training and evaluation get separate env copies, so an evaluation never
        disturbs training episodes that a `resume` run left in progress."""
        key = _key(config)
        manager = self.managers.get(key)
        if manager is not None and not manager.done:
            return manager
        if manager is not None:
            self._restarts_before += manager.stats["restarts"]
            manager.close()
        fns = [_env_fn(self.env_spec, self._kwargs(config))] * config.num_envs
        manager_config: dict[str, Any] = (
            {} if config.step_timeout is None else {"step_timeout": config.step_timeout}
        )
        if config.env_manager == "ray":  # what each env copy's actor asks of its node
            manager_config.update(self.env_spec.get("envWorkers") or {})
        make: Callable[[list[EnvFn], dict[str, Any]], EnvManager] = ALL_MANAGERS[config.env_manager]
        manager = self.managers[key] = make(fns, manager_config)
        manager.launch()
        return manager

    def _kwargs(self, config: GymEpisodeSettings) -> dict[str, Any]:
        """initialize's env kwargs, under this call's `envKwargs`."""
        return {**(self.env_spec.get("kwargs") or {}), **(config.env_kwargs or {})}

    def do_reset(self) -> None:
        self._close_managers()
        self._restarts_before = 0

    def do_terminate(self) -> None:
        self._close_managers()

    def _close_managers(self) -> None:
        self._carried.clear()
        managers, self.managers = list(self.managers.values()), {}
        for manager in managers:
            manager.close()


def probe_env(env: dict[str, Any], modules: Iterable[str]) -> tuple[gym.Space, gym.Space]:
    """What initialize checks of a gymnasium env (and the league's solo workers' env): its
    module, when named (``MODULE:ID``), is one of `modules` (``--env-module``) before anything
    is imported; its id is registered; one instance is made and closed, and its spaces are
    ones the services carry. Returns the (observation, action) spaces; InvalidRequest (400)
    otherwise: bad kwargs or settings fail now, not as a failed service later. An env served
    over dm_env_rpc (``env.dmEnvRpc``) is probed by joining a world of its server: `id` is
    its label, imported from nowhere."""
    if env.get("dmEnvRpc") is not None:
        if env.get("thinker") is not None:
            raise InvalidRequest(
                "env.thinker plans on copies of its env, and an env served over dm_env_rpc "
                "cannot be copied: give one of thinker or dmEnvRpc"
            )
        return _probe(env)
    module, _, name = env["id"].rpartition(":")
    if module and module not in modules:
        raise InvalidRequest(
            f"env {env['id']!r}: module {module!r} is not one this orchestrator may "
            "import; its operator can allow it with --env-module "
            f"{module} (allowed now: {', '.join(sorted(modules)) or 'none'})"
        )
    try:  # "module:EnvId-v0": the module registers the env, as gym.make does
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except (ImportError, gym.error.Error) as exc:
        raise InvalidRequest(f"unknown gymnasium env {env['id']!r}: {exc}") from exc
    return _probe(env)


def _probe(env: dict[str, Any]) -> tuple[gym.Space, gym.Space]:
    """The env's (observation, action) spaces, from one instance made and closed; raises
    InvalidRequest when it cannot be made with these kwargs or has unsupported spaces."""
    try:
        probe = _env_fn(env, env.get("kwargs", {}))()
    except Exception as exc:
        what = f"kwargs {env.get('kwargs', {})}"
        if env.get("dmEnvRpc") is not None:
            what = f"world settings {env.get('kwargs', {})} from dm_env_rpc at {env['dmEnvRpc']}"
        if env.get("thinker") is not None:
            what += f" and Thinker settings {env['thinker']}"
        raise InvalidRequest(
            f"env {env['id']!r} cannot be made with {what}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        if not isinstance(probe.action_space, SUPPORTED):
            raise InvalidRequest(
                f"{env['id']} has an action space {probe.action_space} that "
                "is not supported: use Box, Discrete, MultiDiscrete or "
                "MultiBinary"
            )
        try:  # observations may also be a Dict of those (sent as one object per entity)
            space_to_dict(probe.observation_space)
        except ValueError as exc:
            raise InvalidRequest(
                f"{env['id']} has an observation space that is not supported: {exc}"
            ) from exc
        return probe.observation_space, probe.action_space
    finally:
        probe.close()


def _env_fn(env: dict[str, Any], kwargs: dict[str, Any]) -> EnvFn:
    """A picklable maker of one env copy: the gymnasium env, or with `env.thinker` the env
    behind the Thinker-augmented MDP (settings of mistk_rl.thinker.config, plus `actions`:
    Discrete or MultiDiscrete), or with `env.dmEnvRpc` a world of that dm_env_rpc server
    (`kwargs`: the world's settings)."""
    if env.get("dmEnvRpc") is not None:
        try:  # (an extra: the orchestrator serves gymnasium envs without it)
            from mistk_rl.bridges.dm_env_rpc_client import DmEnvRpcEnvFactory
        except ImportError as exc:
            raise InvalidRequest(
                f"env.dmEnvRpc needs the dm_env_rpc extra (pip install "
                f"'mistk-rl[dm_env_rpc]'): {exc}"
            ) from None
        return DmEnvRpcEnvFactory(
            tuple(sorted(env["dmEnvRpc"].items())), tuple(sorted(kwargs.items()))
        )
    if env.get("thinker") is None:
        return make_env_fns(env["id"], kwargs, 1)[0]
    settings = dict(env["thinker"])
    actions = settings.pop("actions", "Discrete")
    return ThinkerEnvFactory(
        env["id"], tuple(sorted(kwargs.items())), tuple(sorted(settings.items())), actions
    )


def _key(config: GymEpisodeSettings) -> tuple:
    kwargs = (
        json.dumps(config.env_kwargs, sort_keys=True, default=repr) if config.env_kwargs else None
    )
    return (config.num_envs, config.env_manager, config.step_timeout, config.train, kwargs)


def _outcome(ts: Timestep, truncated: bool) -> StepOutcome:
    """What an env copy's step led to, for its agent; an abnormal step ends its episode as
    a truncation. Envs that put the legal actions in info["action_mask"] give those of the
    new observation, so a learner bootstraps from legal actions only."""
    return StepOutcome(
        ts.obs,
        float(ts.reward),
        bool(ts.terminated and not ts.abnormal),
        bool(ts.truncated or truncated or ts.abnormal),
        ts.info.get("action_mask"),
    )


def _masks(manager: EnvManager, ready: dict[int, Any]) -> Optional[dict[int, Any]]:
    """Action masks of the ready envs (gymnasium envs such as Taxi put them in
    info["action_mask"]); None when the env has none."""
    info = manager.ready_info
    masks = {
        i: np.asarray(info[i]["action_mask"]) for i in ready if "action_mask" in info.get(i, {})
    }
    return masks or None


def _entity_masks(masks: Optional[dict[int, Any]], entity) -> Optional[dict[str, Any]]:
    return {entity(i): m for i, m in masks.items()} if masks else None
