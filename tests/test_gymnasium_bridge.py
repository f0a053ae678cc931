"""The gymnasium bridge (`mistk_rl.bridges.gymnasium_env`): an orchestrator's env copies as a
gymnasium Env and VectorEnv that the caller steps. gymnasium's and SB3's env checkers pass
on it over the gym orchestrator (CartPole, the Thinker MDP) and on a game seat against a
random opponent; a connect-four seat plays the league's fixed opponent (win-block); it
replays gymnasium's own CartPole exactly (the VectorEnv as SyncVectorEnv does in SAME_STEP
autoreset mode); bad actions and bad settings get clear errors; an orchestrator that dies or
stops answering makes step() raise, naming it; close() leaves no process and no thread."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from mistk_rl.bridges.gymnasium_env import ENV_ID, OrchestratorEnv, OrchestratorVectorEnv
from mistk_rl.bridges.gymnasium_relay import BridgeError
from mistk_rl.bridges.gymnasium_sb3 import OrchestratorVecEnv
from mistk_rl.bridges.gymnasium_settings import GAME_ORCHESTRATOR
from mistk_rl.deploy.launch import group_members
from tests.conftest import GYM_ORCHESTRATOR, REPO

pytestmark = pytest.mark.timeout(120)
CARTPOLE = {"id": "CartPole-v1"}
THINKER = {
    "id": "mistk_rl.thinker.puzzle:MistkPuzzle-v0",
    "thinker": {"wrapper_type": 2, "rec_t": 4, "max_depth": 3, "train_model": False},
}
TICTACTOE_VS_RANDOM: dict[str, Any] = {
    "env": {"id": "classic/tictactoe-v3"},
    "target": GAME_ORCHESTRATOR,
    "seat": "player_1",
    "opponents": [
        {
            "name": "random",
            "target": "agents.opponent_agents:MaskedRandomAgent",
            "seats": ["player_2"],
            "hyperparameters": {"seed": 1},
        }
    ],
}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # (the services started import agents/ and orchestrators/)


def _started(env: Any) -> list:
    """The services the bridge started (to check they are gone after close)."""
    return list(env.unwrapped._session._started)


@contextmanager
def leaves_nothing() -> Iterator[list]:
    """Collect the bridged envs made inside; after the block, each is closed and neither
    a process they started nor a thread is left."""
    before = set(threading.enumerate())
    made: list = []
    try:
        yield made
    finally:
        services = [s for env in made for s in _started(env)]
        for env in made:
            env.close()
    left = [s.process.pid for s in services if group_members(s.process.pid)]
    assert not left, f"processes left behind: {left}"
    threads = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not threads, f"threads left behind: {threads}"


def _quiet_check(env: gym.Env) -> None:
    """gymnasium's check_env and SB3's on the env (their warnings about inf bounds and
    small images are the envs' own, as in-process)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env.unwrapped, skip_close_check=True)  # (close: checked by the caller)
        sb3_check_env(env.unwrapped)


def test_cartpole_passes_both_checkers_and_replays_gymnasium_exactly():
    with leaves_nothing() as made:
        env = gym.make(ENV_ID, env=CARTPOLE)
        made.append(env)
        assert len(_started(env)) == 1  # the orchestrator, started for it
        _quiet_check(env)
        here = gym.make("CartPole-v1")
        obs, info = env.reset(seed=7)
        expected, _ = here.reset(seed=7)
        np.testing.assert_array_equal(obs, expected)
        assert info == {}
        episodes = 0
        for k in range(150):
            got = env.step(k % 2)
            want = here.step(k % 2)
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1:4] == want[1:4] and type(got[1]) is float
            if got[2] or got[3]:  # the orchestrator reset the copy already: its next episode
                episodes += 1
                np.testing.assert_array_equal(env.reset()[0], here.reset()[0])
        assert episodes >= 3
        with pytest.raises(gym.error.InvalidAction, match=r"action 2 is not in the action space"):
            env.step(2)
        with pytest.raises(gym.error.InvalidAction, match=r"Discrete\(2\)"):
            env.step(np.array([0.5, 1.0]))
        env.step(0)  # the request still waits for a good answer: it takes it
    env.close()  # (closing twice is allowed)


def test_the_vector_env_is_sync_vector_env_in_same_step_mode():
    with leaves_nothing() as made:
        envs = gym.make_vec(ENV_ID, num_envs=3, env=CARTPOLE)
        made.append(envs)
        assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        assert envs.observation_space.shape == (3, 4) and envs.single_action_space.n == 2
        here = gym.vector.SyncVectorEnv(
            [lambda: gym.make("CartPole-v1")] * 3, autoreset_mode=AutoresetMode.SAME_STEP
        )
        obs, _ = envs.reset(seed=[5, 6, 7])
        np.testing.assert_array_equal(obs, here.reset(seed=5)[0])
        assert obs in envs.observation_space
        rng, ended = np.random.default_rng(0), 0
        for _ in range(120):
            actions = rng.integers(0, 2, 3)
            obs, rewards, terminated, truncated, info = envs.step(actions)
            want = here.step(actions)
            for got, expected in zip((obs, rewards, terminated, truncated), want[:4]):
                np.testing.assert_array_equal(got, expected)
            if "final_obs" in want[4]:
                ended += int(want[4]["_final_obs"].sum())
                np.testing.assert_array_equal(info["_final_obs"], want[4]["_final_obs"])
                for i in np.flatnonzero(want[4]["_final_obs"]):
                    np.testing.assert_array_equal(info["final_obs"][i], want[4]["final_obs"][i])
            else:
                assert "final_obs" not in info
        assert ended >= 5
        with pytest.raises(ValueError, match=r"seed \+ i"):
            envs.reset(seed=[1, 1, 1])
        with pytest.raises(gym.error.InvalidAction, match="env copy 1"):
            envs.step(np.array([0, 3, 1]))


def test_sb3_steps_the_copies_as_one_vec_env():
    with leaves_nothing() as made:
        venv = OrchestratorVectorEnv(CARTPOLE, num_envs=2)
        made.append(venv)
        sb3 = OrchestratorVecEnv(venv)
        sb3.seed(3)
        obs = sb3.reset()
        np.testing.assert_array_equal(obs[1], gym.make("CartPole-v1").reset(seed=4)[0])
        dones_seen = 0
        for _ in range(60):
            obs, rewards, dones, infos = sb3.step(np.zeros(2, dtype=np.int64))
            assert rewards.dtype == np.float32 and obs.shape == (2, 4)
            for i in np.flatnonzero(dones):
                dones_seen += 1
                assert infos[i]["terminal_observation"].shape == (4,)
                assert infos[i]["TimeLimit.truncated"] is False  # (pushing left: it falls)
        assert dones_seen >= 2


def test_the_thinker_mdp_passes_both_checkers():
    with leaves_nothing() as made:
        env = OrchestratorEnv(THINKER)
        made.append(env)
        assert isinstance(env.observation_space, gym.spaces.Dict)
        assert set(env.observation_space.spaces) == {"tree_reps", "real_states"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # (a class, not gym.make: check_env skips determinism without a spec; the id
            # path's determinism is checked on CartPole and tictactoe)
            check_env(env, skip_close_check=True)
            sb3_check_env(env)
        obs, _ = env.reset(seed=0)
        obs, reward, *_ = env.step(env.action_space.sample())
        assert obs in env.observation_space and isinstance(reward, float)


def test_a_game_seat_against_a_random_opponent():
    with leaves_nothing() as made:
        env = gym.make(ENV_ID, **TICTACTOE_VS_RANDOM)
        made.append(env)
        assert len(_started(env)) == 2  # the game orchestrator and the opponent
        assert env.action_space == gym.spaces.Discrete(9)
        _quiet_check(env)  # (seeded resets replay the opponent's moves too)
        obs, info = env.reset(seed=0)
        assert obs.dtype == np.int8 and info["action_mask"].tolist() == [1] * 9
        rng, returns, total = np.random.default_rng(0), [], 0.0
        while len(returns) < 15:
            action = rng.choice(np.flatnonzero(info["action_mask"]))
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            if terminated or truncated:
                returns.append(total)
                total = 0.0
                obs, info = env.reset()
        assert set(returns) <= {-1.0, 0.0, 1.0} and len(set(returns)) > 1


def test_a_connect_four_seat_against_the_leagues_fixed_opponent():
    """The connect-four league's fixed opponent (win-block, served as the league serves it)
    in the other seat: a caller that stacks column 0 would win within seven moves against a
    random player, but win-block blocks the fourth stone every time."""
    settings = {
        **TICTACTOE_VS_RANDOM,
        "env": {"id": "classic/connect_four-v3"},
        "seat": "player_0",
        "opponents": [
            {
                "name": "winblock",
                "target": "agents.opponent_agents:ConnectFourWinBlockAgent",
                "seats": ["player_1"],
                "hyperparameters": {"seed": 3},
            }
        ],
    }
    with leaves_nothing() as made:
        env = gym.make(ENV_ID, **settings)
        made.append(env)
        assert env.action_space == gym.spaces.Discrete(7)
        returns = []
        for episode in range(8):
            obs, info = env.reset(seed=episode)
            done, total = False, 0.0
            while not done:
                action = int(np.flatnonzero(info["action_mask"])[0])  # (column 0 first)
                obs, reward, terminated, truncated, info = env.step(action)
                total, done = total + float(reward), terminated or truncated
            returns.append(total)
        assert 1.0 not in returns, f"win-block let the stack in column 0 win: {returns}"


def test_bad_settings_get_clear_errors_and_leave_nothing():
    with pytest.raises(ValueError, match="a dict with an 'id'"):
        OrchestratorEnv({"kwargs": {}})
    with pytest.raises(ValueError, match="numEpisodes are the bridge's own"):
        OrchestratorEnv(CARTPOLE, episode={"numEpisodes": 3})
    with pytest.raises(TypeError, match="unknown bridge settings"):
        OrchestratorEnv(CARTPOLE, num_env=2)
    with pytest.raises(ValueError, match="use OrchestratorVectorEnv"):
        OrchestratorEnv(CARTPOLE, num_envs=2)
    before = set(threading.enumerate())
    with pytest.raises(BridgeError, match="unknown gymnasium env 'NoSuchEnv-v0'"):
        OrchestratorEnv({"id": "NoSuchEnv-v0"})
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_an_orchestrator_that_dies_mid_episode_makes_step_raise():
    with leaves_nothing() as made:
        env = OrchestratorEnv(CARTPOLE, timeouts={"step": 60, "health_every": 0.2})
        made.append(env)
        env.reset(seed=0)
        env.step(0)
        (orchestrator,) = _started(env)
        os.killpg(orchestrator.process.pid, signal.SIGKILL)
        with pytest.raises(BridgeError, match=r"orchestrator .* exited with code -9"):
            for _ in range(10_000):  # (the answer in flight may still land: then the next)
                env.step(0)


def test_an_orchestrator_at_a_url_that_stops_answering(launch):
    """One the bridge did not start: step raises once it does not answer (here: stopped
    with SIGSTOP), and close leaves it reset, as it was found."""
    service = launch("orchestrator", GYM_ORCHESTRATOR)
    with leaves_nothing() as made:
        env = OrchestratorEnv(
            CARTPOLE, url=service.url, timeouts={"call": 2, "step": 30, "health_every": 0.2}
        )
        made.append(env)
        assert _started(env) == []
        env.reset(seed=0)
        os.killpg(service.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(BridgeError, match=f"orchestrator at {service.url} does not answer"):
                for _ in range(10_000):
                    env.step(0)
        finally:
            os.killpg(service.process.pid, signal.SIGCONT)
    assert service.client().wait_for_state("uninitialized", 30).state == "uninitialized"
