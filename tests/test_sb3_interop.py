"""Interop with Stable-Baselines3 both ways, over HTTP: an SB3 model served as an agent
(`agents/sb3_agent.py`) plays a game and acts as SB3 itself does; a served agent is a
policy object (`mistk_rl.sdk.served_policy.ServedPolicy`) that SB3's `evaluate_policy` drives."""

from __future__ import annotations

import gymnasium as gym
import pytest

from mistk_rl.sdk.client import BadRequest
from mistk_rl.sdk.served_policy import ServedPolicy
from tests.conftest import RANDOM_AGENT

sb3 = pytest.importorskip("stable_baselines3")
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

SB3_AGENT = "agents.sb3_agent:SB3Agent"
GAME = "orchestrators.game_orchestrator:GameOrchestrator"


def _served_sb3(launch, model, file_name: str, **hparams):
    """An SB3Agent service holding `model` (saved into its data dir), built; a misspelled
    hyperparameter is refused first (400, with the one meant)."""
    service = launch("agent", SB3_AGENT)
    model.save(service.data_dir / file_name)
    client = service.client()
    with pytest.raises(BadRequest, match="Did you mean 'algo'"):
        client.initialize(hyperparameters={"algos": "ppo"})
    client.initialize(hyperparameters=hparams)
    client.build_model(file_name)
    return service, client


def _episodes(policy, seed: int = 7, n: int = 2) -> list[float]:
    env = make_vec_env("CartPole-v1", n_envs=2, seed=seed)
    rewards, _ = evaluate_policy(policy, env, n_eval_episodes=n, return_episode_rewards=True)
    return rewards


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
def test_an_sb3_model_served_acts_as_sb3_does(launch, algo):
    """SB3's evaluate_policy on the same seeded envs: the model in-process and the model
    served by SB3Agent, reached through ServedPolicy, play the same episodes."""
    model = getattr(sb3, algo)(
        "MlpPolicy", "CartPole-v1", seed=0, device="cpu", policy_kwargs={"net_arch": [32]}
    )
    if algo == "DQN":  # (a fresh DQN's Q-values are near-ties: let it see a little)
        model.exploration_rate = 0.0
    _, client = _served_sb3(launch, model, "cartpole.zip")  # (algo read from the zip)
    env = gym.make("CartPole-v1")
    wrong = {
        "name": "p",
        "observationSpace": {
            "type": "Box",
            "shape": [3],
            "dtype": "float32",
            "low": [-1.0] * 3,
            "high": [1.0] * 3,
        },
        "actionSpace": {"type": "Discrete", "n": 2},
    }
    with pytest.raises(BadRequest, match="trained on the observation space Box"):
        client.agent_registered(wrong)
    with ServedPolicy(client, env.observation_space, env.action_space) as served:
        assert _episodes(served) == _episodes(model)
        one, _ = served.predict(env.reset(seed=0)[0])  # one observation: one action
        assert one.shape == () and env.action_space.contains(int(one))
    assert client.status().state == "ready"  # close() ended its episode


def test_a_served_agent_is_a_policy_for_sb3s_evaluate_policy(launch):
    """Any agent: the random agent, acting through ServedPolicy in SB3's loop."""
    client = launch("agent", RANDOM_AGENT).client()
    client.initialize(hyperparameters={"seed": 3})
    client.build_model()
    env = gym.make("CartPole-v1")
    with ServedPolicy(client, env.observation_space, env.action_space) as served:
        rewards = _episodes(served, n=4)
    assert len(rewards) == 4 and all(8 <= r <= 100 for r in rewards)  # a random policy's


def test_an_sb3_model_plays_a_game_within_its_action_masks(launch):
    """An untrained SB3 PPO (or DQN) in tic-tac-toe: the game orchestrator sends the legal
    moves, SB3Agent takes the best legal one by its logits (Q-values): no illegal move."""
    from mistk_rl.games.pettingzoo_games import probe_game

    obs_space, act_space = probe_game({"id": "classic/tictactoe-v3"}).spaces["player_1"]

    class Board(gym.Env):  # (the game's spaces, for SB3 to build its networks on)
        observation_space, action_space = obs_space, act_space

    orch = launch("orchestrator", GAME).client()
    orch.initialize({"id": "classic/tictactoe-v3"}, agents_needed=2)
    for name, algo in (("ppo", sb3.PPO), ("dqn", sb3.DQN)):
        service, _ = _served_sb3(
            launch, algo("MlpPolicy", Board(), seed=0, device="cpu"), f"{name}.zip", algo=name
        )
        orch.register_agent(name, service.url, skip_train=True)
    orch.start_episode(
        {"numEpisodes": 12, "numEnvs": 4, "seed": 0, "seatAssignment": "alternate", "train": False},
        wait=True,
        timeout=120,
    )
    results = orch.get_results()
    assert len(results.episodes) == 12
    assert sum(t["illegal"] for a in results.totals.values() for t in a.values()) == 0
    assert {e.winner for e in results.episodes} <= {"player_1", "player_2", None}
