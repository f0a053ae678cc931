"""PPO for Box action spaces (Gaussian densities, clipping) and its model (encoders)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from mistk_rl.rl.data.samples import RolloutSamples
from mistk_rl.rl.models import ActorCritic
from mistk_rl.rl.policies.dqn import DQNPolicy
from mistk_rl.rl.policies.ppo import PPOPolicy
from mistk_rl.rl.wrappers import GaussianSample, gaussian_log_prob_entropy

OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 0.5], np.float32))


def test_log_prob_and_entropy_match_torch_normal():
    gen = torch.Generator().manual_seed(0)
    mu, log_std = torch.randn(6, 3, generator=gen), torch.randn(6, 3, generator=gen)
    action = torch.randn(6, 3, generator=gen) * 3
    log_prob, entropy = gaussian_log_prob_entropy(mu, log_std, action)
    normal = torch.distributions.Normal(mu, log_std.exp())
    assert torch.allclose(log_prob, normal.log_prob(action).sum(-1), atol=1e-5)
    assert torch.allclose(entropy, normal.entropy().sum(-1), atol=1e-5)


def test_gaussian_sample_draws_around_the_mean_and_evaluates_given_actions():
    model = ActorCritic(OBS, 2, hidden_sizes=(8,), continuous=True, log_std_init=-1.0)
    obs = torch.randn(4000, 3)
    out = GaussianSample(model, torch.Generator().manual_seed(1))(obs)
    noise = out["action"] - out["mu"]
    assert torch.allclose(noise.std(0), torch.full((2,), float(np.exp(-1.0))), rtol=0.05)
    normal = torch.distributions.Normal(out["mu"], out["log_std"].exp())
    assert torch.allclose(out["log_prob"], normal.log_prob(out["action"]).sum(-1), atol=1e-5)
    # given actions: evaluated with gradients, log-std included
    again = GaussianSample(model)(obs[:8], action=out["action"][:8].detach())
    assert torch.equal(again["action"], out["action"][:8])
    (again["log_prob"].sum() + again["entropy"].sum()).backward()
    assert model.head.log_std.grad is not None and torch.isfinite(model.head.log_std.grad).all()
    assert torch.allclose(
        GaussianSample(model)(obs[:5], deterministic=True)["action"], out["mu"][:5], atol=1e-6
    )
    with pytest.raises(ValueError, match="discrete actions only"):
        GaussianSample(model)(obs[:2], mask=torch.ones(2, 2))


def test_env_gets_the_clipped_action_and_the_log_prob_is_the_samples():
    # a wide Gaussian: most samples fall outside the narrow bounds
    policy = PPOPolicy({"model": {"log_std_init": 1.0}}, OBS, ACT, seed=0)
    obs = torch.as_tensor(np.stack([OBS.sample() for _ in range(256)]))
    out = policy.collect_mode.forward(obs, None, 0)
    sampled, sent = out["action"], out["env_action"]
    assert sent.shape == (256, *ACT.shape)
    low, high = torch.as_tensor(ACT.low), torch.as_tensor(ACT.high)
    assert torch.equal(sent, sampled.clamp(low, high)) and not torch.equal(sent, sampled)
    assert all(ACT.contains(a) for a in sent.numpy())
    normal = torch.distributions.Normal(out["mu"], out["log_std"].exp())
    assert torch.allclose(out["log_prob"], normal.log_prob(sampled).sum(-1), atol=1e-5)
    # the learner re-evaluates the stored (sampled) action: ratio 1 before any update
    transition = policy.collect_mode.process_transition(
        obs[0].numpy(), {k: v[0] for k, v in out.items()}, 0.0, obs[1].numpy(), False, False
    )
    assert torch.equal(torch.as_tensor(transition["action"]), sampled[0])
    again = policy.collect_model(policy._encode(obs[:1]), action=sampled[:1])
    assert torch.allclose(again["log_prob"], out["log_prob"][:1], atol=1e-6)
    # eval: the mean, clipped
    greedy = policy.eval_mode.forward(obs, None)
    assert torch.equal(greedy["action"], out["mu"].clamp(low, high))


def test_continuous_ppo_learns_on_a_rollout():
    policy = PPOPolicy({"learn": {"epochs": 2, "batch_size": 32}}, OBS, ACT, seed=0)
    obs = torch.as_tensor(np.stack([OBS.sample() for _ in range(64)]))
    out = policy.collect_mode.forward(obs, None, 0)
    batch = RolloutSamples(
        obs=obs,
        action=out["action"],
        log_prob=out["log_prob"],
        value=out["value"],
        advantage=torch.randn(64),
        returns=torch.randn(64),
    )
    before = policy.model.head.log_std.detach().clone()
    info = policy.learn_mode.forward(batch)
    assert np.isfinite(info["loss"]) and not torch.equal(policy.model.head.log_std, before)


def test_dqn_refuses_box_actions_and_ppo_accepts_them():
    with pytest.raises(ValueError, match="needs a Discrete action space"):
        DQNPolicy(None, OBS, ACT)
    with torch.device("meta"):  # as the agent's registration check builds it
        PPOPolicy(None, OBS, ACT)


@pytest.mark.parametrize(
    "obs_space, encoder",
    [
        (spaces.Box(0, 255, (10, 10, 3), np.uint8), "ImageEncoder"),
        (spaces.Discrete(5), "FlatEncoder"),
    ],
)
def test_ppo_encoders_follow_the_observation_space(obs_space, encoder):
    policy = PPOPolicy({"learn": {"epochs": 1, "batch_size": 4}}, obs_space, ACT, seed=0)
    assert type(policy.model.actor_encoder).__name__ == encoder
    obs = torch.as_tensor(np.stack([obs_space.sample() for _ in range(8)]))
    out = policy.collect_mode.forward(obs, None, 0)
    info = policy.learn_mode.forward(
        RolloutSamples(
            obs=obs,
            action=out["action"],
            log_prob=out["log_prob"],
            value=out["value"],
            advantage=torch.randn(8),
            returns=torch.randn(8),
        )
    )
    assert np.isfinite(info["loss"])


def test_ppo_loads_weights_saved_with_the_flat_mlp_encoder():
    old_policy = PPOPolicy(None, OBS, ACT, seed=1)
    old = dict(old_policy.model.state_dict())  # as the flat MLPEncoder saved it: + an alias
    for encoder in ("actor_encoder", "critic_encoder"):
        for kind in ("weight", "bias"):
            old[f"{encoder}._first_layer.{kind}"] = old[f"{encoder}.mlp.net.0.{kind}"]
    policy = PPOPolicy(None, OBS, ACT, seed=0)
    policy.learn_mode.load_state_dict({"model": old, "optimizer": policy.optimizer.state_dict()})
    obs = torch.randn(4, 3)
    assert torch.allclose(policy.model(obs)["mu"], old_policy.model(obs)["mu"])
