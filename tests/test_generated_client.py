"""A client generated from the packaged specs by a standard generator (openapi-python-client,
run plainly, no config) covers every operation and drives whole episodes with JSON bodies,
against real services.

The generator types JSON, form, multipart and octet-stream bodies only, so it leaves out the
step operations' second request body, application/vnd.mistk.tensors, with a warning each, and
keeps their JSON form. Its `content_type_overrides` could map that type to bytes, but 0.29's
template then annotates a two-body operation's body with `Unset` without importing it, and
those modules fail to import (openapi-python-client#1451): so no config, and the binary
encoding stays the SDK's (tests/test_codec.py, tests/test_step_columns.py)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import gymnasium as gym
import httpx
import pytest
import yaml

from mistk_rl.spaces import space_to_dict
from mistk_rl.wire import codec
from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT

pytest.importorskip("openapi_python_client")

SPECS = resources.files("mistk_rl.openapi")
ROLES = ("agent", "orchestrator")
BASE_PATHS = {"agent": "/v1/mistk/agent", "orchestrator": "/v1/mistk/orchestrator"}
PARSE_WARNING = re.compile(r"^WARNING parsing (\w+) (\S+) within", re.MULTILINE)
# a generated operation module's request: `"method": "post",\n "url": "/getAction",`
REQUEST = re.compile(r'"method": "(\w+)",\s*"url": "([^"]+)"')
ENV = "CartPole-v1"
WAIT = 60.0  # seconds any state change may take on a loaded machine


@dataclass
class Generated:
    """The generated packages, by name, and what the generator printed for each."""

    packages: dict[str, ModuleType]
    output: dict[str, str]


def _spec(role: str) -> dict[str, Any]:
    return yaml.safe_load(SPECS.joinpath(f"{role}.yaml").read_text())


def _operations(role: str) -> Iterator[tuple[str, str, dict]]:
    """(method, path, operation) of every operation in the role's packaged spec."""
    for path, methods in _spec(role)["paths"].items():
        for method, op in methods.items():
            yield method, path, op


def _generate(role: str, out: Path) -> str:
    """Run the generator as its users do, the spec read from the installed package; what it
    printed. The interpreter's bin dir goes first on PATH, for the ruff its hooks run."""
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "openapi-python-client"), "generate", "--meta", "none"]
    command += ["--path", str(SPECS.joinpath(f"{role}.yaml")), "--output-path", str(out)]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(out.parent)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    printed = done.stdout + done.stderr
    assert done.returncode == 0 and (out / "client.py").is_file(), printed
    return printed


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Iterator[Generated]:
    """Both clients, generated plainly as `mistk_agent` and `mistk_orchestrator`, imported
    from a temporary dir."""
    root = tmp_path_factory.mktemp("generated")
    runs = {f"mistk_{role}": role for role in ROLES}
    output = {name: _generate(role, root / name) for name, role in runs.items()}
    sys.path.insert(0, str(root))
    try:
        packages = {name: importlib.import_module(name) for name in runs}
        for name in runs:  # (the tests read package.models: imported here, not by chance)
            importlib.import_module(f"{name}.models")
        yield Generated(packages, output)
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.split(".")[0] in runs]:
            del sys.modules[name]


def _requests(package: ModuleType) -> dict[tuple[str, str], ModuleType]:
    """(method, path) -> the generated module that sends that request."""
    api = importlib.import_module(f"{package.__name__}.api")
    found = {}
    for info in pkgutil.walk_packages(api.__path__, f"{api.__name__}."):
        module = importlib.import_module(info.name)
        match = REQUEST.search(inspect.getsource(module)) if not info.ispkg else None
        if match:
            found[(match[1], match[2])] = module
    return found


@pytest.mark.parametrize("role", ROLES)
def test_every_operation_has_a_generated_function(generated, role):
    requests = _requests(generated.packages[f"mistk_{role}"])
    operations = list(_operations(role))
    for method, path, op in operations:
        module = requests.get((method, path))
        assert module is not None, f"{role}: nothing generated for {op['operationId']}"
        for function in ("sync_detailed", "sync", "asyncio_detailed"):
            assert callable(getattr(module, function, None)), f"{op['operationId']}: {function}"
    assert len(requests) == len(operations)


def test_generator_warns_only_of_the_tensor_encoding(generated):
    """The one thing the generator leaves out is each step operation's binary request body
    (module doc); anything else it cannot type would show here first."""
    binary = {
        (method.upper(), path)
        for method, path, op in _operations("agent")
        if codec.CONTENT_TYPE in op.get("requestBody", {}).get("content", {})
    }
    plain = generated.output["mistk_agent"]
    assert set(PARSE_WARNING.findall(plain)) == binary and len(binary) == 5
    details = re.findall(r"^(Unsupported.*|Cannot parse.*|Invalid.*)$", plain, re.MULTILINE)
    assert details == [f"Unsupported content type {codec.CONTENT_TYPE}"] * len(binary)
    assert not PARSE_WARNING.search(generated.output["mistk_orchestrator"])


def _client(package: ModuleType, service: Any, role: str) -> Any:
    # httpx's 5 s default is shorter than the status long-poll
    timeout = httpx.Timeout(WAIT + 10)
    return package.Client(service.url + BASE_PATHS[role], timeout=timeout)


def _call(package: ModuleType, operation: str, client: Any, **kwargs: Any) -> Any:
    """Call a generated operation by its module path (e.g. "lifecycle.initialize"); the
    parsed answer, after checking it is not a Problem."""
    module = importlib.import_module(f"{package.__name__}.api.{operation}")
    answer = module.sync_detailed(client=client, **kwargs)
    assert answer.status_code < 300, (operation, answer.status_code, answer.content)
    return answer.parsed


def _wait(package: ModuleType, client: Any, done: Callable[[str], bool]) -> Any:
    """Long-poll the status (generated `status` op) until `done(state)`; that status."""
    deadline = time.monotonic() + WAIT
    status = _call(package, "status.status", client)
    while not done(status.state):
        assert time.monotonic() < deadline, f"still {status.state} after {WAIT} s"
        version = status.resource_version
        status = _call(package, "status.status", client, resource_version=version, timeout=5.0)
    return status


def _built_agent(package: ModuleType, client: Any) -> None:
    """initialize and buildModel, each waited on; the agent then waits for registration."""
    models = package.models
    _call(package, "lifecycle.initialize", client, body=models.AgentInitParams.from_dict({}))
    _wait(package, client, lambda state: state == "initialized")
    before = _call(package, "status.status", client).resource_version
    assert _call(package, "lifecycle.build_model", client).state == "building_model"
    status = _wait(package, client, lambda state: state != "building_model")
    assert status.state == "initialized" and status.resource_version > before + 1


def test_generated_clients_run_an_orchestrated_episode(generated, launch):
    """initialize, buildModel, registerAgent, startEpisode and getResults, the generated
    clients only; the agent answered every step the orchestrator took."""
    agent_pkg = generated.packages["mistk_agent"]
    orch_pkg = generated.packages["mistk_orchestrator"]
    agent_service = launch("agent", RANDOM_AGENT, wait=False)
    orch_service = launch("orchestrator", GYM_ORCHESTRATOR, wait=False)
    agent_service.wait_ready(WAIT)
    orch_service.wait_ready(WAIT)
    agent = _client(agent_pkg, agent_service, "agent")
    orch = _client(orch_pkg, orch_service, "orchestrator")
    _built_agent(agent_pkg, agent)
    init = orch_pkg.models.OrchestratorInitParams.from_dict({"env": {"id": ENV}})
    _call(orch_pkg, "lifecycle.initialize", orch, body=init)
    _wait(orch_pkg, orch, lambda state: state == "waiting_for_agents")
    registered = _call(
        orch_pkg, "lifecycle.register_agent", orch, agent_name="player", agent_url=agent_service.url
    )
    assert registered.state == "ready"
    assert _call(agent_pkg, "status.status", agent).state == "ready"
    episodes = orch_pkg.models.EpisodeConfig.from_dict({"numEpisodes": 2, "seed": 7})
    _call(orch_pkg, "episodes.start_episode", orch, body=episodes)
    _wait(orch_pkg, orch, lambda state: state == "completed_episode")
    results = _call(orch_pkg, "episodes.get_results", orch)
    assert [(e.episode, e.agent) for e in results.episodes] == [(0, "player"), (1, "player")]
    for episode in results.episodes:  # CartPole: +1 a step, to the end
        assert episode.return_ == episode.length > 0 and episode.terminated
    assert results.episodes[0].seed == 7
    payload = _call(agent_pkg, "status.status", agent).payload.additional_properties
    assert payload["actionsTaken"] == sum(e.length for e in results.episodes)
    assert _call(orch_pkg, "episodes.stop_episode", orch).state == "ready"


def _registered_agent(package: ModuleType, launch: Callable[..., Any]) -> tuple[Any, gym.Env]:
    """A random agent, built and told CartPole's spaces through the generated client."""
    client = _client(package, launch("agent", RANDOM_AGENT), "agent")
    _built_agent(package, client)
    env = gym.make(ENV)
    config = {
        "name": "player",
        "observationSpace": space_to_dict(env.observation_space),
        "actionSpace": space_to_dict(env.action_space),
    }
    body = package.models.AgentConfig.from_dict(config)
    assert _call(package, "lifecycle.agent_registered", client, body=body).state == "ready"
    return client, env


def _action(answer: Any, entity: str = "player") -> int:
    action = answer.actions.additional_properties[entity]
    assert action in (0, 1), action
    return int(action)


def _entity_episode(package: ModuleType, client: Any, env: gym.Env) -> int:
    """One episode as an orchestrator of one entity drives it: getAction, then by turns
    replayAction + getAction and step (the same in one call); the last transition goes by
    replayAction. Its length."""
    models = package.models
    obs, _ = env.reset(seed=3)
    start = models.EpisodeStart.from_dict({"obs": {"player": obs.tolist()}, "episode": 0})
    assert _call(package, "episodes.episode_started", client, body=start).state == "in_episode"
    ask = {"obs": {"player": obs.tolist()}}
    action = _action(
        _call(package, "actions.get_action", client, body=models.ActionRequest.from_dict(ask))
    )
    length, done = 0, False
    while not done:
        new_obs, reward, terminated, truncated, _ = env.step(action)
        length, done = length + 1, terminated or truncated
        replay = {
            "prevObs": {"player": obs.tolist()},
            "actions": {"player": action},
            "rewards": {"player": float(reward)},
            "newObs": {"player": new_obs.tolist()},
            "terminated": {"player": bool(terminated)},
            "truncated": {"player": bool(truncated)},
        }
        ask, obs = {"obs": {"player": new_obs.tolist()}}, new_obs
        if done or length % 2 == 0:
            body = models.Replay.from_dict(replay)
            assert _call(package, "actions.replay_action", client, body=body).state == "in_episode"
        if done:
            continue
        if length % 2 == 0:
            answer = _call(
                package, "actions.get_action", client, body=models.ActionRequest.from_dict(ask)
            )
        else:
            step = models.StepRequest.from_dict({"replay": replay, **ask})
            answer = _call(package, "actions.step", client, body=step)
        action = _action(answer)
    assert _call(package, "episodes.episode_stopped", client).state == "ready"
    return length


def _column_episode(package: ModuleType, client: Any, copies: int) -> tuple[dict[int, float], int]:
    """One episode of `copies` CartPole copies through stepColumns, in JSON, as the gym
    orchestrator steps them: each request reports every copy's last step (its step id,
    reward and flags, the observation it led to) and asks the next action of those not done;
    a done copy reports once with act false and leaves. Each copy's return, and the actions."""
    models, envs = package.models, [gym.make(ENV) for _ in range(copies)]
    obs = {i: env.reset(seed=i)[0] for i, env in enumerate(envs)}
    start = models.EpisodeStart.from_dict({"obs": {"player": obs[0].tolist()}, "episode": 1})
    assert _call(package, "episodes.episode_started", client, body=start).state == "in_episode"
    report = {i: (-1, 0.0, False, False) for i in obs}  # step id, reward, terminated, truncated
    returns, seen = dict.fromkeys(obs, 0.0), set[int]()
    while report:
        rows = sorted(report)
        act = [not (report[i][2] or report[i][3]) for i in rows]
        body = {"envs": rows, "obs": [obs[i].tolist() for i in rows], "act": act}
        for column, name in enumerate(("stepIds", "rewards", "terminated", "truncated")):
            body[name] = [report[i][column] for i in rows]
        answer = _call(
            package, "actions.step_columns", client, body=models.StepColumns.from_dict(body)
        )
        acting = [i for i, acts in zip(rows, act) if acts]
        assert len(answer.actions) == len(answer.step_ids) == len(acting)
        assert all(a in (0, 1) for a in answer.actions), answer.actions
        assert all(s >= 0 for s in answer.step_ids) and seen.isdisjoint(answer.step_ids)
        seen.update(answer.step_ids)
        report = {}
        for i, action, step_id in zip(acting, answer.actions, answer.step_ids):
            obs[i], reward, terminated, truncated, _ = envs[i].step(action)
            returns[i] += float(reward)
            report[i] = (step_id, float(reward), bool(terminated), bool(truncated))
    assert _call(package, "episodes.episode_stopped", client).state == "ready"
    return returns, len(seen)


def test_generated_agent_client_steps_whole_episodes(generated, launch):
    """The agent alone, driven as an orchestrator would: one episode entity by entity, one
    of three copies in columns; the agent counts every action it answered."""
    package = generated.packages["mistk_agent"]
    client, env = _registered_agent(package, launch)
    length = _entity_episode(package, client, env)
    returns, column_actions = _column_episode(package, client, copies=3)
    assert length > 0 and all(value > 0 for value in returns.values())
    assert column_actions == sum(returns.values())  # CartPole: +1 for each step taken
    payload = _call(package, "status.status", client).payload.additional_properties
    assert payload["actionsTaken"] == length + column_actions
