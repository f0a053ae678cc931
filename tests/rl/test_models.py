"""Models (mistk_rl.rl.models) and model wrappers (mistk_rl.rl.wrappers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from mistk_rl.rl.encoders import MLP
from mistk_rl.rl.models import ActorCritic, QHead, QNetwork, without_aliases
from mistk_rl.rl.wrappers import (
    ArgmaxSample,
    EpsGreedySample,
    MultinomialSample,
    TargetNetwork,
    apply_mask,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class Echo(nn.Module):
    """Logits are the observation itself (times a parameter of ones), so tests choose them."""

    def __init__(self, action_n: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(action_n))

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logit": obs * self.scale, "value": obs.sum(-1)}


def random_mask(batch: int, action_n: int, seed: int = 0) -> torch.Tensor:
    """A random mask with at least one allowed action per row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, action_n, generator=g) < 0.5
    mask[torch.arange(batch), torch.randint(action_n, (batch,), generator=g)] = True
    return mask


# ---- models ---------------------------------------------------------------------------------


def test_mlp_widths_and_activation_names():
    assert MLP(4, [8, 6]).output_dim == 6
    assert MLP(4, [8], out_dim=3)(torch.zeros(2, 4)).shape == (2, 3)
    assert MLP(4, []).output_dim == 4
    assert isinstance(MLP(4, [8], activation="tanh").net[1], nn.Tanh)
    with pytest.raises(ValueError, match="unknown activation 'sigmoidal'"):
        MLP(4, [8], activation="sigmoidal")


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu", "gelu", "silu"])
def test_mlp_computes_what_its_layers_called_in_order_do(activation):
    """MLP.forward runs each layer's forward directly (no per-layer call overhead): the
    output and the gradients are bit for bit those of calling `net`, an nn.Sequential."""
    mlp = MLP(4, [16, 8], activation=activation, out_dim=3)
    x = torch.randn(5, 4)
    ours = mlp(x)
    ours.square().sum().backward()
    ours_grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    theirs = mlp.net(x)
    theirs.square().sum().backward()
    assert torch.equal(ours, theirs)
    assert all(torch.equal(a, p.grad) for a, p in zip(ours_grads, mlp.parameters()))
    assert not torch.equal(ours, MLP(4, [16, 8], activation=activation, out_dim=3)(x))


BOX4 = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)


def _qnet() -> QNetwork:
    return QNetwork(BOX4, 3)


@pytest.mark.parametrize("dueling", [False, True])
def test_q_network_shapes(dueling):
    net = QNetwork(BOX4, action_n=3, hidden_sizes=(32, 16), dueling=dueling)
    out = net(torch.randn(7, 4))
    assert set(out) == {"logit"} and out["logit"].shape == (7, 3)
    assert (net.head.value is not None) == dueling


def test_dueling_head_subtracts_mean_advantage():
    head = QHead(in_dim=5, action_n=4, dueling=True, hidden_size=8)
    features = torch.randn(6, 5)
    q = head(features)
    value, advantage = head.streams(features)
    assert torch.allclose(
        q - q.mean(-1, keepdim=True), advantage - advantage.mean(-1, keepdim=True), atol=1e-6
    )
    assert torch.allclose(q.mean(-1, keepdim=True), value, atol=1e-6)
    with torch.no_grad():
        head.out.net[-1].bias += 10.0  # shift every advantage by a constant
    assert torch.allclose(head(features), q, atol=1e-5)


def test_plain_head_has_no_streams():
    with pytest.raises(RuntimeError, match="dueling"):
        QHead(5, 4).streams(torch.randn(1, 5))


@pytest.mark.parametrize("share", [False, True])
def test_actor_critic_outputs(share):
    net = ActorCritic(BOX4, action_n=3, hidden_sizes=(16, 16), share_encoder=share)
    obs = torch.randn(5, 4)
    out = net(obs)
    assert out["logit"].shape == (5, 3) and out["value"].shape == (5,)
    assert torch.equal(net.compute_critic(obs)["value"], out["value"])
    assert net.share_encoder == share


def test_actor_critic_sharing_halves_the_encoder_and_init_follows_cleanrl():
    separate, shared = ActorCritic(BOX4, 3), ActorCritic(BOX4, 3, share_encoder=True)
    encoder_params = sum(p.numel() for p in separate.actor_encoder.parameters())
    n_params = [sum(p.numel() for p in m.parameters()) for m in (separate, shared)]
    assert n_params[0] - n_params[1] == encoder_params
    policy_w, value_w = shared.head.policy.weight, shared.head.value.weight
    assert torch.allclose(policy_w @ policy_w.T, 1e-4 * torch.eye(3), atol=1e-7)  # gain .01
    assert torch.allclose(value_w.norm(), torch.tensor(1.0))  # gain 1
    hidden = separate.actor_encoder.mlp.net[0].weight  # [64, 4]: orthonormal columns * 2
    assert torch.allclose(hidden.T @ hidden, 2.0 * torch.eye(4), atol=1e-5)
    assert torch.all(shared.head.policy.bias == 0)


def test_weights_of_old_checkpoints_load_without_their_first_layer_alias():
    """Checkpoints written before encoders followed the space listed the flat encoder's
    first layer twice ("_first_layer"); the same tensors, so dropping the alias loads them."""
    net = _qnet()
    old = dict(net.state_dict())
    old["encoder._first_layer.weight"] = old["encoder.mlp.net.0.weight"]
    old["encoder._first_layer.bias"] = old["encoder.mlp.net.0.bias"]
    with pytest.raises(RuntimeError, match="_first_layer"):
        _qnet().load_state_dict(old)
    fresh = _qnet()
    fresh.load_state_dict(without_aliases(old))
    obs = torch.randn(3, 4)
    assert torch.equal(fresh(obs)["logit"], net(obs)["logit"])


# ---- wrappers: masks and sampling -----------------------------------------------------------

OBS = torch.tensor([[1.0, 5.0, 3.0], [9.0, 2.0, 0.0]])
MASK = torch.tensor([[True, False, True], [False, True, True]])


def test_argmax_respects_mask_and_passes_outputs_through():
    argmax = ArgmaxSample(Echo(3))
    assert argmax(OBS)["action"].tolist() == [1, 0]
    out = argmax(OBS, MASK)
    assert out["action"].tolist() == [2, 1]
    assert out["action"].dtype == torch.long
    assert torch.isneginf(out["logit"][~MASK]).all()
    assert torch.equal(out["value"], OBS.sum(-1))
    assert argmax(OBS, MASK.int().numpy())["action"].tolist() == [2, 1]  # 0/1 numpy works


@pytest.mark.parametrize(
    "mask, match",
    [
        (torch.tensor([[True, False, True], [False, False, False]]), "allows no action"),
        (torch.ones(2, 2, dtype=torch.bool), "does not match"),
    ],
)
def test_bad_masks_are_rejected(mask, match):
    with pytest.raises(ValueError, match=match):
        apply_mask(OBS, mask)


@pytest.mark.parametrize("rng", [np.random.default_rng(0), torch.Generator().manual_seed(0), None])
def test_eps_greedy_with_eps_one_covers_exactly_the_allowed_actions(rng):
    batch, action_n = 400, 5
    mask = random_mask(1, action_n).expand(batch, action_n)
    actions = EpsGreedySample(Echo(action_n), rng)(torch.randn(batch, action_n), 1.0, mask)
    assert set(actions["action"].tolist()) == set(torch.nonzero(mask[0]).flatten().tolist())


def test_eps_greedy_with_eps_zero_is_argmax():
    obs, mask = torch.randn(64, 6), random_mask(64, 6)
    model = Echo(6)
    greedy = EpsGreedySample(model, np.random.default_rng(0))(obs, 0.0, mask)["action"]
    assert torch.equal(greedy, ArgmaxSample(model)(obs, mask)["action"])


def test_eps_greedy_explores_at_rate_eps_and_is_reproducible():
    obs = torch.tensor([[0.0, 0.0, 1.0, 0.0]]).expand(4000, 4)  # greedy action is 2
    sample = EpsGreedySample(Echo(4), np.random.default_rng(1))
    actions = sample(obs, 0.4)["action"]
    non_greedy = (actions != 2).float().mean().item()
    assert non_greedy == pytest.approx(0.4 * 3 / 4, abs=0.03)
    again = EpsGreedySample(Echo(4), np.random.default_rng(1))(obs, 0.4)["action"]
    assert torch.equal(actions, again)
    with pytest.raises(ValueError, match="eps"):
        sample(obs, 1.5)


class _Refuses(torch.nn.Module):
    def forward(self, obs):
        raise AssertionError("the model ran although every row explores")


def test_eps_greedy_that_explores_everywhere_skips_the_model_and_still_obeys_masks():
    obs = torch.zeros(3000, 4)
    sample = EpsGreedySample(_Refuses(), np.random.default_rng(0), action_n=4)
    counts = torch.bincount(sample(obs, 1.0)["action"], minlength=4)
    assert counts.min() > 650  # uniform over the 4 actions (750 each expected)
    mask = torch.tensor([[False, True, False, True]]).expand(3000, 4)
    assert set(sample(obs, 1.0, mask)["action"].tolist()) == {1, 3}
    with pytest.raises(ValueError, match="allows no action"):
        sample(obs[:2], 1.0, torch.tensor([[True, False, False, False], [False] * 4]))
    dict_obs = {"a": torch.zeros(5, 2), "b": torch.zeros(5, 3)}
    assert sample(dict_obs, 1.0)["action"].shape == (5,)
    with pytest.raises(AssertionError, match="the model ran"):
        sample(obs[:500], 0.5)  # some rows are greedy: the model must run


def test_multinomial_never_picks_masked_and_follows_softmax():
    batch = 4000
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).expand(batch, 4)
    mask = torch.tensor([[True, True, False, True]]).expand(batch, 4)
    sample = MultinomialSample(Echo(4), torch.Generator().manual_seed(0))
    actions = sample(logits, mask)["action"]
    assert not (actions == 2).any()
    freq = torch.bincount(actions, minlength=4).float() / batch
    expected = torch.softmax(torch.tensor([0.0, 1.0, float("-inf"), 3.0]), -1)
    assert torch.allclose(freq, expected, atol=0.03)


def test_multinomial_log_prob_and_entropy_match_categorical():
    obs, mask = torch.randn(32, 5), random_mask(32, 5, seed=3)
    out = MultinomialSample(Echo(5))(obs, mask)
    dist = torch.distributions.Categorical(logits=obs.masked_fill(~mask, float("-inf")))
    assert torch.allclose(out["log_prob"], dist.log_prob(out["action"]))
    assert torch.allclose(out["entropy"], dist.entropy())
    assert torch.isfinite(out["log_prob"]).all() and torch.isfinite(out["entropy"]).all()


def test_multinomial_evaluates_given_actions_with_gradients():
    model = ActorCritic(BOX4, 3)
    obs, mask = torch.randn(8, 4), random_mask(8, 3)
    action = mask.float().argmax(-1)  # the first allowed action of each row
    out = MultinomialSample(model)(obs, mask, action=action)
    assert torch.equal(out["action"], action)
    logits = model(obs)["logit"].masked_fill(~mask, float("-inf"))
    assert torch.allclose(
        out["log_prob"], torch.log_softmax(logits, -1).gather(1, action[:, None]).squeeze(1)
    )
    (out["log_prob"].sum() + out["entropy"].sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


# ---- wrappers: sharing and the target network ----------------------------------------------


def test_wrappers_share_the_model_instead_of_copying():
    model = _qnet()
    wrappers = [ArgmaxSample(model), EpsGreedySample(model), MultinomialSample(model)]
    for wrapper in wrappers:
        assert all(a is b for a, b in zip(wrapper.parameters(), model.parameters()))
        assert wrapper.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # an update through the model ...
    obs = torch.randn(3, 4)
    assert torch.equal(wrappers[0](obs)["logit"], model(obs)["logit"])  # ... is seen by all
    wrappers[1].eval()
    assert not model.training and not wrappers[2].training
    wrappers[2].train()
    assert model.training


def test_target_network_is_a_frozen_copy():
    model = _qnet()
    target = TargetNetwork(model)
    assert not any(a is b for a, b in zip(target.parameters(), model.parameters()))
    assert all(not p.requires_grad for p in target.parameters())
    assert not target.training and model.training
    out = target(torch.randn(2, 4), torch.tensor([[True, False, True]] * 2))
    assert not out["logit"].requires_grad and torch.isneginf(out["logit"][:, 1]).all()


def weights_equal(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def perturb(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))


def test_hard_target_copies_only_every_n_steps():
    model = _qnet()
    target = TargetNetwork(model, update="hard", every=3)
    for step in range(1, 7):
        perturb(model)
        target.step()
        assert weights_equal(target.target, model) == (step % 3 == 0), step
    obs = torch.randn(5, 4)
    assert torch.equal(target(obs)["logit"], model(obs)["logit"])


def test_soft_target_moves_by_tau_every_step():
    model = _qnet()
    target = TargetNetwork(model, update="soft", tau=0.1)
    for _ in range(2):
        before = [p.clone() for p in target.parameters()]
        perturb(model)
        target.step()
        for old, new, online in zip(before, target.parameters(), model.parameters()):
            assert torch.allclose(new, 0.1 * online + 0.9 * old, atol=1e-6)


def test_target_state_round_trip_keeps_weights_and_step_counter():
    model = _qnet()
    target = TargetNetwork(model, every=10)
    perturb(model)
    for _ in range(14):
        target.step()
    restored = TargetNetwork(_qnet(), every=10)
    restored.load_state_dict(target.state_dict())
    assert restored.steps == 14 and weights_equal(restored.target, target.target)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"update": "polyak"}, "'hard' or 'soft'"),
        ({"every": 0}, "every must be >= 1"),
        ({"tau": 0.0}, r"tau must be in \(0, 1\]"),
    ],
)
def test_target_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TargetNetwork(_qnet(), **kwargs)
