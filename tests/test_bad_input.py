"""Bad input gets a 4xx that names what is wrong and changes nothing (state, version, files).

Handlers are driven in-process (they are plain methods); registerAgent meets real loopback
servers that answer as no agent would.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest

from agents.random_agent import RandomAgent
from mistk_rl.errors import IllegalState, InvalidRequest
from mistk_rl.limits import Limits
from mistk_rl.service.handlers import AgentService, OrchestratorService
from mistk_rl.spaces import space_to_dict
from mistk_rl.wire import codec
from orchestrators.gym_orchestrator import GymOrchestrator
from tests.conftest import RANDOM_AGENT

CARTPOLE = gym.make("CartPole-v1")
SPACES = {
    "observationSpace": space_to_dict(CARTPOLE.observation_space),
    "actionSpace": space_to_dict(CARTPOLE.action_space),
}
OBS = [0.01, -0.02, 0.03, 0.04]


def _agent(tmp_path, limits=Limits(), first_obs=OBS, **spaces) -> AgentService:
    service = AgentService(RandomAgent(), tmp_path / "agent", limits=limits)
    service.initialize({"hyperparameters": {"seed": 0}})
    service.lifecycle.wait_for_state("initialized", 10)
    service.buildModel()
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered({"name": "p", **(spaces or SPACES)})
    service.episodeStarted({"obs": {"p": first_obs}})
    return service


def _refused(service, call, *args, match: str) -> InvalidRequest:
    before = service.lifecycle.status()
    with pytest.raises(InvalidRequest, match=match) as info:
        call(*args)
    after = service.lifecycle.status()
    assert (after["state"], after["resourceVersion"]) == (
        before["state"],
        before["resourceVersion"],
    )
    return info.value


def _replay(**override):
    replay = {
        "prevObs": {"p": OBS},
        "actions": {"p": 1},
        "rewards": {"p": 1.0},
        "newObs": {"p": OBS},
        "terminated": {"p": False},
        "truncated": {"p": False},
    }
    replay.update(override)
    return replay


# ---- observations and actions against the registered spaces ---------------------------------
@pytest.mark.parametrize(
    "obs, match",
    [
        ([0.0] * 5, r"obs\['p'\]: shape \(5,\) is not \(4,\)"),
        ([[0.0, 1.0], [2.0]], "rectangular"),  # ragged
        ([1e308 * 10, 0, 0, 0], "finite"),
    ],
)
def test_observations_must_belong_to_the_observation_space(tmp_path, obs, match):
    service = _agent(tmp_path)
    _refused(service, service.getAction, {"obs": {"p": obs}}, match=match)
    _refused(service, service.step, {"obs": {"p": obs}}, match=match)
    service.getAction({"obs": {"p": OBS}})  # and the agent still acts on good input


def test_float_observations_outside_their_bounds_are_taken(tmp_path):
    """Envs leave their observation bounds (LunarLander-v3's velocities do; gymnasium only
    warns), so a float Box's bounds are not enforced on observations; actions keep theirs."""
    service = _agent(tmp_path)
    outside = [0.0, 0.0, 9.9, 0.0]  # the pole angle's bound is 0.42 rad
    assert service.getAction({"obs": {"p": outside}})[1] == 200
    body = {"obs": {"p": outside}, "replay": _replay(newObs={"p": outside})}
    assert service.step(body)[1] == 200


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("actions", {"p": 2}, r"replay.actions\['p'\]: a value is outside the space"),
        ("actions", {"p": 0.5}, "not integral"),
        ("newObs", {"p": [0.0] * 3}, r"replay.newObs\['p'\]: shape"),
        ("rewards", {"p": [1.0, 2.0]}, "one finite number"),
    ],
)
def test_replayed_transitions_must_belong_to_the_spaces(tmp_path, field, value, match):
    service = _agent(tmp_path)
    body = {"obs": {"p": OBS}, "replay": _replay(**{field: value})}
    _refused(service, service.step, body, match=match)
    _refused(
        service, service.replayAction, _replay(**{field: value}), match=match.replace("replay.", "")
    )


def test_binary_bodies_are_checked_in_one_pass(tmp_path):
    service = _agent(tmp_path)
    for bad, match in ((np.full((3, 4), np.nan), "finite"), (np.zeros((3, 5)), "shape")):
        body = codec.decode(codec.encode({"obs": {f"p:{i}": row for i, row in enumerate(bad)}}))
        _refused(service, service.getAction, body, match=match)


def test_action_masks_have_one_flag_per_action(tmp_path):
    service = _agent(tmp_path)
    _refused(
        service,
        service.getAction,
        {"obs": {"p": OBS}, "actionMask": {"p": [1, 0, 1]}},
        match=r"actionMask\['p'\]: shape \(3,\) is not \(2,\)",
    )


def _any_agent(tmp_path, agent: str) -> AgentService:
    """`_agent`'s registered, in-episode service, for the random, DQN or PPO agent."""
    import importlib

    if agent == "RandomAgent":
        return _agent(tmp_path)
    cls = getattr(importlib.import_module(f"agents.{agent[:3].lower()}_agent"), agent)
    service = _policy_agent(tmp_path, cls)
    service.agentRegistered({"name": "p", **SPACES})
    service.episodeStarted({"obs": {"p": OBS}})
    return service


@pytest.mark.parametrize("agent", ["RandomAgent", "DQNAgent", "PPOAgent"])
def test_a_mask_that_allows_no_action_is_refused(tmp_path, agent):
    """An all-zero mask left the agent nothing to pick: each agent failed in its hook (the
    random agent's ValueError, DQN's multinomial, PPO's masked logits)."""
    service = _any_agent(tmp_path, agent)
    match = r"actionMask\['player'\]: the mask allows no action"
    body = {"obs": {"player": [0, 0, 0, 0]}, "actionMask": {"player": [0, 0]}}
    error = _refused(service, service.getAction, body, match=match)
    assert (error.extra["field"], error.extra["entity"]) == ("actionMask", "player")
    _refused(service, service.step, {**body, "replay": _replay()}, match=match)
    many = {f"e{i}": [0, 1] for i in range(6)}  # stacked: checked in one pass, still named
    many["e3"] = [0, 0]
    _refused(
        service,
        service.getAction,
        {"obs": {e: OBS for e in many}, "actionMask": many},
        match=r"actionMask\['e3'\]: the mask allows no action",
    )
    binary = codec.decode(codec.encode({"obs": {e: OBS for e in many}, "actionMask": many}))
    _refused(service, service.step, binary, match=r"actionMask\['e3'\]: the mask allows")
    assert service.getAction({"obs": {"p": OBS}, "actionMask": {"p": [0, 1]}})[0] == {
        "actions": {"p": 1}
    }  # and it still acts, inside the mask
    # a replayed newActionMask may allow nothing: the episode is over (games send zeros)
    ended = _replay(terminated={"p": True}, newActionMask={"p": [0, 0]})
    assert service.step({"obs": {"p": OBS}, "replay": ended})[1] == 200
    service.episodeStopped()
    _refused(service, service.episodeStarted, body, match=match)


def test_integer_image_spaces_refuse_fractions(tmp_path):
    image = gym.spaces.Box(0, 255, (2, 2), np.uint8)
    service = _agent(
        tmp_path,
        first_obs=[[0, 0], [0, 0]],
        observationSpace=space_to_dict(image),
        actionSpace=SPACES["actionSpace"],
    )
    _refused(service, service.getAction, {"obs": {"p": [[0.5, 1], [2, 3]]}}, match="not integral")
    _refused(service, service.getAction, {"obs": {"p": [[0, 1], [2, 300]]}}, match="outside")
    service.getAction({"obs": {"p": [[0, 1], [2, 255]]}})


# ---- limits ---------------------------------------------------------------------------------
def test_a_huge_space_is_refused_before_anything_is_allocated(tmp_path):
    service = AgentService(RandomAgent(), tmp_path / "agent")
    service.initialize({})
    service.lifecycle.wait_for_state("initialized", 10)
    error = _refused(
        service,
        service.agentRegistered,
        {
            "name": "p",
            "observationSpace": SPACES["observationSpace"],
            "actionSpace": {"type": "MultiBinary", "shape": [200_000, 200_000]},
        },
        match="max_space_elements",
    )
    assert error.extra["limit"] == "max_space_elements"


HUGE = 10**18


@pytest.mark.parametrize("agent", ["RandomAgent", "DQNAgent", "PPOAgent"])
@pytest.mark.parametrize(
    "key, space, count",
    [
        ("actionSpace", {"type": "Discrete", "n": HUGE}, f"{HUGE:,}"),  # its mask check: 7 EiB
        ("observationSpace", {"type": "Discrete", "n": HUGE}, f"{HUGE:,}"),  # one-hot: overflow
        ("actionSpace", {"type": "Discrete", "n": 2**63}, f"{2**63:,}"),  # past int64
        ("actionSpace", {"type": "MultiDiscrete", "nvec": [HUGE, 2]}, f"{HUGE + 2:,}"),
        ("observationSpace", {"type": "MultiDiscrete", "nvec": [[2**64]]}, f"{2**64:,}"),
        (
            "observationSpace",
            {"type": "Box", "shape": [HUGE, 0], "low": [], "high": []},
            f"{HUGE:,}",
        ),  # no numbers, but an axis that long
        ("actionSpace", {"type": "MultiBinary", "shape": [0, HUGE]}, f"{HUGE:,}"),
        (
            "observationSpace",
            {"type": "Dict", "spaces": {"a": {"type": "Discrete", "n": HUGE}}},
            f"{HUGE:,}",
        ),
    ],
)
def test_a_space_too_big_to_mask_or_encode_is_refused_by_the_limit(
    tmp_path, agent, key, space, count
):
    """A Discrete(n) counts n numbers (its masks, one-hot encodings and policy outputs hold
    n); a MultiDiscrete sum(nvec). A Discrete(10**18) put the random agent in failed (its
    mask check allocated 10**18 flags) and was a 500 from DQN and PPO (torch's size
    overflow)."""
    import importlib

    cls = (
        RandomAgent
        if agent == "RandomAgent"
        else getattr(importlib.import_module(f"agents.{agent[:3].lower()}_agent"), agent)
    )
    service = _policy_agent(tmp_path, cls)
    body = {"name": "p", **SPACES, key: space}
    error = _refused(
        service,
        service.agentRegistered,
        body,
        match=f"{key}: the count of numbers .* is {count}, over the limit "
        "max_space_elements=1,000,000",
    )
    assert error.extra["limit"] == "max_space_elements"
    if agent != "RandomAgent":  # the same spaces as modelProperties, at initialize
        service.reset()
        service.lifecycle.wait_for_state("started", 10)
        _refused(
            service,
            service.initialize,
            {"modelProperties": dict(SPACES, **{key: space})},
            match=f"modelProperties.{key}: the count of numbers",
        )


def test_a_discrete_space_counts_its_n_against_the_limit(tmp_path):
    service = _policy_agent(tmp_path, RandomAgent, Limits(max_space_elements=100))
    for n in (101, 1000):
        _refused(
            service,
            service.agentRegistered,
            {"name": "p", **SPACES, "actionSpace": {"type": "Discrete", "n": n}},
            match=f"is {n:,}, over the limit max_space_elements=100",
        )
    _refused(
        service,
        service.agentRegistered,
        {"name": "p", **SPACES, "actionSpace": {"type": "MultiDiscrete", "nvec": [60, 41]}},
        match="is 101, over the limit",
    )
    service.agentRegistered({"name": "p", **SPACES, "actionSpace": {"type": "Discrete", "n": 100}})
    service.episodeStarted({"obs": {"p": OBS}})
    assert service.getAction({"obs": {"p": OBS}, "actionMask": {"p": [0] * 99 + [1]}})[0] == {
        "actions": {"p": 99}
    }


@pytest.mark.parametrize(
    "space, match",
    [
        ({"type": "MultiDiscrete", "nvec": [[2, 3], [2]]}, "inhomogeneous"),  # schemathesis: a 500
        # integer bounds a cast would wrap: int8 1000 is -24; 2**63-1 through float64 is -2**63
        (
            {"type": "Box", "shape": [2], "dtype": "int8", "low": [-1000, 0], "high": [1000, 1]},
            r"Box low holds a number outside -128\.\.127",
        ),
        (
            {"type": "Box", "shape": [1], "dtype": "int64", "low": [0], "high": [2**63 - 1]},
            "Box high holds a number outside",
        ),
        (
            {"type": "Box", "shape": [1], "dtype": "uint8", "low": [0.5], "high": [1]},
            "must be finite integers",
        ),
        ({"type": "Discrete", "n": 10, "start": 2**63 - 5}, "do not fit int64"),  # wrapped
        ({"type": "Box", "shape": [2], "low": [[0.0], 1.0], "high": 1.0}, "inhomogeneous"),
        ({"type": "Box", "shape": [3], "low": [0.0, 0.0], "high": 1.0}, "shape"),
        ({"type": "Discrete"}, "'n'"),
    ],
)
def test_spaces_that_describe_nothing_are_refused_at_registration(tmp_path, space, match):
    service = AgentService(RandomAgent(), tmp_path / "agent")
    service.initialize({})
    service.lifecycle.wait_for_state("initialized", 10)
    error = _refused(
        service,
        service.agentRegistered,
        {"name": "p", "observationSpace": SPACES["observationSpace"], "actionSpace": space},
        match=match,
    )
    assert error.detail.startswith("actionSpace is not a valid space")
    assert service.lifecycle.state == "initialized"


def _orchestrator(tmp_path, limits=Limits(), env_modules=()) -> OrchestratorService:
    service = OrchestratorService(
        GymOrchestrator(), tmp_path / "orch", limits=limits, env_modules=env_modules
    )
    return service


def test_env_copies_and_processes_are_limited(tmp_path, launch):
    service = _orchestrator(tmp_path, Limits(max_envs=8, max_env_processes=4))
    service.initialize({"env": {"id": "CartPole-v1"}})
    service.lifecycle.wait_for_state("waiting_for_agents", 10)
    _refused(service, service.startEpisode, {"numEnvs": 9}, match="max_envs=8")  # in any state
    with pytest.raises(IllegalState):  # within the request's limits: on to the state check
        service.startEpisode({"numEnvs": 8})
    agent = launch("agent", RANDOM_AGENT)
    client = agent.client()
    client.initialize()
    client.build_model()
    service.registerAgent("p", agent.url)
    service.lifecycle.wait_for_state("ready", 10)  # processes count against what runs now
    _refused(
        service,
        service.startEpisode,
        {"numEnvs": 5, "envManager": "subprocess"},
        match="max_env_processes=4",
    )


def test_an_episode_before_initialize_is_a_conflict_whatever_it_asks(tmp_path):
    service = _orchestrator(tmp_path)  # no env yet: env kwargs cannot be checked against one
    for body in ({"numEnvs": 2}, {"numEnvs": 2, "envKwargs": {"max_episode_steps": 5}}):
        with pytest.raises(IllegalState, match="uninitialized"):
            service.startEpisode(body)
    assert service.lifecycle.state == "uninitialized"


def test_limits_parse_names_and_refuse_unknown_ones():
    assert Limits.parse(["max_envs=9", "max-space-elements=10"]) == Limits(
        max_envs=9, max_space_elements=10
    )
    for bad in (["max_env=1"], ["max_envs=x"], ["max_envs=0"]):
        with pytest.raises(ValueError):
            Limits.parse(bad)


# ---- env ids --------------------------------------------------------------------------------
def test_env_modules_are_imported_only_when_allowed(tmp_path):
    assert "this" not in sys.modules
    service = _orchestrator(tmp_path)
    _refused(
        service, service.initialize, {"env": {"id": "this:CartPole-v1"}}, match="--env-module this"
    )
    assert "this" not in sys.modules  # refused before any import
    _refused(
        service, service.initialize, {"env": {"id": "NoSuchEnv-v0"}}, match="unknown gymnasium env"
    )
    allowed = _orchestrator(tmp_path, env_modules=["tests.rl.faulty_env"])
    allowed.initialize(
        {
            "env": {
                "id": "tests.rl.faulty_env:FaultyCartPole-v0",
                "kwargs": {"mode": "exit", "at": 5, "marker": str(tmp_path / "marker")},
            }
        }
    )
    assert allowed.lifecycle.wait_for_state("waiting_for_agents", 10)


# ---- registerAgent against things that are not agents ---------------------------------------
class _Impostor(http.server.BaseHTTPRequestHandler):
    """A loopback server that is no agent: answers every request with `reply`."""

    reply = (200, b"{}")

    def _answer(self) -> None:
        status, body = self.reply
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def impostor():
    servers = []

    def start(status: int, body: bytes) -> str:
        handler = type("Reply", (_Impostor,), {"reply": (status, body)})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_register_agent_refuses_what_is_not_an_agent_and_echoes_nothing(tmp_path, impostor):
    service = _orchestrator(tmp_path)
    service.initialize({"env": {"id": "CartPole-v1"}})
    service.lifecycle.wait_for_state("waiting_for_agents", 10)
    secret = b'{"title": "SECRET-PAGE", "detail": "SECRET-CONTENT"}'
    cases = {
        "http://127.0.0.1:99999": "invalid port",
        "http://127.0.0.1:abc": "invalid port",
        impostor(200, b"<html>hello</html>"): "not a mistk-rl one",
        impostor(302, b""): "not a mistk-rl one",
        impostor(
            200, json.dumps({"version": "1", "role": "orchestrator"}).encode()
        ): "not an agent",
        impostor(404, secret): "HTTP 404",
        impostor(500, secret): "HTTP 500",
    }
    for url, match in cases.items():
        error = _refused(service, service.registerAgent, "p", url, match=match)
        assert "SECRET" not in error.detail
    assert service.lifecycle.state == "waiting_for_agents"


@pytest.mark.parametrize(
    "url, match",
    [
        ("http://[::1", "Invalid IPv6 URL"),  # urllib's ValueError was a 500
        ("http://[zz]:8081/", "does not appear to be an IPv4 or IPv6 address"),
        ("http://ex\u2100ample/", "NFKC"),
        ("http://[::1]x:8081/", "host part '\\[::1\\]x:8081' is malformed"),  # urllib: host ::1
        ("http://[::1]]/", "malformed"),
        ("http://127.0.0.1:8081/a b", "whitespace or a control character"),
        ("http://127.0.0.1:8081/\r\nX-Injected: 1", "whitespace or a control character"),
    ],
)
def test_a_malformed_agent_url_is_refused_naming_agent_url(tmp_path, url, match):
    service = _orchestrator(tmp_path)
    service.initialize({"env": {"id": "CartPole-v1"}})
    service.lifecycle.wait_for_state("waiting_for_agents", 10)
    error = _refused(service, service.registerAgent, "p", url, match=match)
    assert error.detail.startswith("agentUrl ") and error.extra["field"] == "agentUrl"
    assert service.orchestrator.agents == {}


# ---- paths in the data dir ------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, match",
    [
        ("a\x00b", "NUL"),
        ("x" * 300, "longer than 255 bytes"),
        (".", "is a directory"),
        ("sub/..", "is a directory"),
        ("../../etc/x", "outside"),
    ],
)
def test_bad_file_names_are_refused_before_any_write(tmp_path, path, match):
    service = _agent(tmp_path)
    service.episodeStopped()
    before = set(tmp_path.rglob("*"))
    _refused(service, service.saveModel, path, match=match)
    assert set(tmp_path.rglob("*")) == before  # no temp file anywhere, not in the parent


def _policy_agent(tmp_path, cls, limits=Limits()):
    service = AgentService(cls(), tmp_path / cls.__name__, limits=limits)
    service.initialize({"hyperparameters": {"seed": 0}})
    service.lifecycle.wait_for_state("initialized", 10)
    service.buildModel()
    service.lifecycle.wait_for_state("initialized", 10)
    return service


@pytest.mark.parametrize("agent", ["DQNAgent", "PPOAgent"])
def test_a_model_over_the_parameter_limit_is_refused_before_it_is_built(tmp_path, agent):
    import importlib

    cls = getattr(importlib.import_module(f"agents.{agent[:3].lower()}_agent"), agent)
    service = _policy_agent(tmp_path, cls)
    wide = gym.spaces.Box(-1, 1, (1000, 1000), np.float32)  # 1e6 inputs: ~64M weights
    error = _refused(
        service,
        service.agentRegistered,
        {
            "name": "p",
            "observationSpace": space_to_dict(wide),
            "actionSpace": SPACES["actionSpace"],
        },
        match="max_model_params",
    )
    assert error.extra["limit"] == "max_model_params"
    assert service.agent.policy is None  # nothing was built
    service.agentRegistered({"name": "p", **SPACES})  # the same agent, spaces that fit
    assert service.agent.policy is not None


def test_dqn_refuses_a_box_action_space_at_registration(tmp_path):
    from agents.dqn_agent import DQNAgent

    service = _policy_agent(tmp_path, DQNAgent)
    _refused(
        service,
        service.agentRegistered,
        {
            "name": "p",
            "observationSpace": SPACES["observationSpace"],
            "actionSpace": space_to_dict(gym.spaces.Box(-1, 1, (1,), np.float32)),
        },
        match="cannot act in these spaces",
    )


def test_env_kwargs_the_env_refuses_get_400_not_a_failed_orchestrator(tmp_path):
    service = _orchestrator(tmp_path)
    _refused(
        service,
        service.initialize,
        {"env": {"id": "CartPole-v1", "kwargs": {"no_such_option": 1}}},
        match="cannot be made with kwargs",
    )
    assert service.lifecycle.state == "uninitialized"


def test_many_entities_are_checked_together_and_the_bad_one_is_named(tmp_path):
    service = _agent(tmp_path)
    obs = {f"p:{i}": list(OBS) for i in range(8)}
    service.getAction({"obs": obs})
    obs["p:5"] = [0.0, float("1e400"), 0.0, 0.0]  # inf, as a JSON parser could make it
    _refused(service, service.getAction, {"obs": obs}, match=r"obs\['p:5'\]: not every")
    obs["p:5"] = [0.0] * 3
    _refused(service, service.getAction, {"obs": obs}, match=r"obs\['p:5'\]: shape")


# ---- dict observations -------------------------------------------------------------------
DICT_SPACE = gym.spaces.Dict(
    {
        "cue": gym.spaces.Box(-1, 1, (2,), np.float32),
        "planes": gym.spaces.Box(0, 1, (2, 2, 2), np.uint8),
    }
)
DICT_OBS = {"cue": [0.5, -0.5], "planes": [[[0, 1], [1, 0]], [[1, 1], [0, 0]]]}


def _dict_agent(tmp_path, limits=Limits()) -> AgentService:
    return _agent(
        tmp_path,
        limits,
        first_obs=DICT_OBS,
        observationSpace=space_to_dict(DICT_SPACE),
        actionSpace=SPACES["actionSpace"],
    )


@pytest.mark.parametrize(
    "obs, match",
    [
        ({"cue": [0.5, -0.5]}, r"obs\['p'\]: missing key\(s\) \['planes'\]"),
        ({**DICT_OBS, "more": [1]}, r"obs\['p'\]: unexpected key\(s\) \['more'\]"),
        ({**DICT_OBS, "cue": [0.5]}, r"obs\['p'\]\['cue'\]: shape \(1,\) is not \(2,\)"),
        (
            {**DICT_OBS, "planes": [[[0, 2], [1, 0]], [[1, 1], [0, 0]]]},
            r"obs\['p'\]\['planes'\]: a value is outside the space",
        ),
        ({**DICT_OBS, "planes": [[[0, 0.5], [1, 0]], [[1, 1], [0, 0]]]}, "not integral"),
        ({**DICT_OBS, "cue": [[0.5], [1.0, 2.0]]}, "rectangular"),
        ([0.5, -0.5], r"obs\['p'\]: one Tensor, where an object with one Tensor per key"),
    ],
)
def test_dict_observations_must_have_the_spaces_keys_and_values(tmp_path, obs, match):
    service = _dict_agent(tmp_path)
    _refused(service, service.getAction, {"obs": {"p": obs}}, match=match)
    _refused(
        service,
        service.step,
        {"obs": {"p": DICT_OBS}, "replay": _replay(prevObs={"p": DICT_OBS}, newObs={"p": obs})},
        match=match.replace("obs", "newObs"),
    )
    if match != "rectangular":  # (a ragged one cannot be encoded)
        binary = codec.decode(codec.encode({"obs": {f"p:{i}": obs for i in range(6)}}))
        _refused(service, service.getAction, binary, match=match.replace("'p'", "'p:0'"))
    service.getAction({"obs": {"p": DICT_OBS}})


def test_a_dict_observation_for_a_box_space_is_refused(tmp_path):
    service = _agent(tmp_path)
    _refused(
        service,
        service.getAction,
        {"obs": {"p": {"cue": OBS}}},
        match=r"obs\['p'\]: an object with keys, where one Tensor is expected",
    )
    binary = codec.decode(codec.encode({"obs": {f"p:{i}": {"cue": OBS} for i in range(6)}}))
    _refused(service, service.getAction, binary, match=r"obs\['p:0'\]: an object with keys")


@pytest.mark.parametrize(
    "space, match",
    [
        ({"type": "Dict", "spaces": {"a": space_to_dict(DICT_SPACE)}}, "a Dict inside a Dict"),
        ({"type": "Dict", "spaces": {"a b": {"type": "Discrete", "n": 2}}}, "does not match"),
        ({"type": "Dict", "spaces": {"": {"type": "Discrete", "n": 2}}}, "Dict key '' does not"),
        ({"type": "Dict", "spaces": {"a\n": {"type": "Discrete", "n": 2}}}, "does not match"),
        (
            {
                "type": "Dict",
                "spaces": {f"k{i}": {"type": "MultiBinary", "shape": [60]} for i in range(2)},
            },
            "120, over the limit max_space_elements",
        ),
    ],
)
def test_dict_spaces_the_contract_cannot_carry_are_refused_at_registration(tmp_path, space, match):
    service = AgentService(RandomAgent(), tmp_path / "agent", limits=Limits(max_space_elements=100))
    service.initialize({})
    service.lifecycle.wait_for_state("initialized", 10)
    _refused(
        service,
        service.agentRegistered,
        {"name": "p", "observationSpace": space, "actionSpace": SPACES["actionSpace"]},
        match=match,
    )


def test_observation_normalisation_refuses_a_dict_space_at_registration(tmp_path):
    from agents.ppo_agent import PPOAgent

    service = AgentService(PPOAgent(), tmp_path / "agent")
    service.initialize({"hyperparameters": {"normalize": {"obs": True}}})
    service.lifecycle.wait_for_state("initialized", 10)
    _refused(
        service,
        service.agentRegistered,
        {
            "name": "p",
            "observationSpace": space_to_dict(DICT_SPACE),
            "actionSpace": SPACES["actionSpace"],
        },
        match="normalize.obs needs a Box",
    )


def test_local_inference_at_registration_needs_an_orchestrator_that_runs_copies(tmp_path):
    """registerAgent's localInference is refused before the agent is asked where the
    orchestrator runs no policy copies (games play their agents over HTTP)."""
    from orchestrators.game_orchestrator import GameOrchestrator

    service = OrchestratorService(GameOrchestrator(), tmp_path / "games")
    service.initialize({"env": {"id": "classic/tictactoe-v3"}})
    service.lifecycle.wait_for_state("waiting_for_agents", 10)
    _refused(
        service,
        service.registerAgent,
        "p",
        "http://127.0.0.1:9/",
        False,
        None,
        True,
        match="GameOrchestrator does not run policy copies",
    )
