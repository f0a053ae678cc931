"""Encoders chosen by the observation space: what each takes and what it gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from mistk_rl.rl.data.samples import ReplaySamples
from mistk_rl.rl.encoders import (
    DictEncoder,
    FlatEncoder,
    ImageEncoder,
    is_image_space,
    make_encoder,
)
from mistk_rl.rl.policies.dqn import DQNPolicy
from mistk_rl.rl.policies.ppo import PPOPolicy

B = 5


def _batch(space: spaces.Space) -> torch.Tensor:
    space.seed(0)
    return torch.as_tensor(np.stack([space.sample() for _ in range(B)]))


@pytest.mark.parametrize(
    "space, kind",
    [
        (spaces.Box(-1, 1, (4,), np.float32), FlatEncoder),
        (spaces.Box(-1, 1, (2, 3), np.float64), FlatEncoder),  # flattened, cast to float32
        (spaces.Discrete(7, start=3), FlatEncoder),  # one-hot
        (spaces.MultiBinary(6), FlatEncoder),
        (spaces.MultiDiscrete([3, 4]), FlatEncoder),
        (spaces.Box(0, 255, (3, 10, 12), np.uint8), ImageEncoder),  # C, H, W; small
        (spaces.Box(0, 255, (40, 44, 4), np.uint8), ImageEncoder),  # H, W, C; Nature stack
        (spaces.Box(0, 255, (84, 84, 1), np.uint8), ImageEncoder),
    ],
)
def test_each_space_gets_its_encoder_and_its_width(space, kind):
    encoder = make_encoder(space, hidden_sizes=(32, 16))
    assert isinstance(encoder, kind)
    features = encoder(_batch(space))
    assert features.shape == (B, encoder.output_dim) and features.dtype == torch.float32
    assert encoder.output_dim == 16


def test_discrete_observations_are_one_hot():
    encoder = FlatEncoder(spaces.Discrete(4, start=2), hidden_sizes=())
    assert torch.equal(
        encoder(torch.tensor([2, 5, 3])), torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]])
    )


def test_images_are_scaled_and_channels_last_are_moved_first():
    hwc = spaces.Box(0, 255, (8, 8, 3), np.uint8)
    chw = spaces.Box(0, 255, (3, 8, 8), np.uint8)
    a, b = ImageEncoder(hwc, 8), ImageEncoder(chw, 8)
    b.load_state_dict(a.state_dict())
    image = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
    assert torch.allclose(a(image), b(image.permute(0, 3, 1, 2)), atol=1e-6)
    assert not is_image_space(spaces.Box(0, 1, (3, 8, 8), np.float32))  # not uint8 pixels


def test_conv_reads_a_boards_planes_as_they_are_where_auto_flattens_them():
    """Connect four's observation (6 x 7 x 2 planes of 0/1, int8) is no image: `auto`
    flattens it into an MLP; `conv` runs the small CNN on it, unscaled, channels moved
    first, and a line shifted across the board reaches the same convolution weights."""
    board = spaces.Dict(
        {
            "observation": spaces.Box(0, 1, (6, 7, 2), np.int8),
            "action_mask": spaces.Box(0, 1, (7,), np.int8),
        }
    )
    auto = make_encoder(board, hidden_sizes=(32,))
    assert isinstance(auto.encoders["observation"], FlatEncoder)
    conv = make_encoder(board, hidden_sizes=(32,), kind="conv")
    planes = conv.encoders["observation"]
    assert isinstance(planes, ImageEncoder) and planes.channels_last and planes.scale == 1.0
    assert planes.cnn[0].in_channels == 2  # the two players' planes
    obs = {
        "observation": torch.zeros(B, 6, 7, 2, dtype=torch.int8),
        "action_mask": torch.ones(B, 7, dtype=torch.int8),
    }
    obs["observation"][:, 5, 0:4, 0] = 1  # four in a row at the bottom
    assert conv(obs).shape == (B, 32)
    first = planes.cnn[0](obs["observation"].float().permute(0, 3, 1, 2))
    shifted = obs["observation"].roll(2, dims=2)
    moved = planes.cnn[0](shifted.float().permute(0, 3, 1, 2))
    assert torch.allclose(first[..., 5, 1:3], moved[..., 5, 3:5], atol=1e-6)  # same filters
    chw = spaces.Box(0, 1, (2, 6, 7), np.float32)  # planes first: left as they are
    assert not make_encoder(chw, (8,), kind="conv").channels_last
    with pytest.raises(ValueError, match="unknown encoder"):
        make_encoder(board, kind="cnn")


def test_policies_take_the_encoder_from_their_model_config():
    board = spaces.Box(0, 1, (6, 7, 2), np.int8)
    dqn = DQNPolicy(
        {"model": {"hidden_sizes": [16], "encoder": "conv"}}, board, spaces.Discrete(7), seed=0
    )
    assert isinstance(dqn.model.encoder, ImageEncoder)
    ppo = PPOPolicy(
        {"model": {"hidden_sizes": [16], "encoder": "conv"}}, board, spaces.Discrete(7), seed=0
    )
    assert isinstance(ppo.model.actor_encoder, ImageEncoder)
    assert isinstance(
        PPOPolicy({}, board, spaces.Discrete(7), seed=0).model.actor_encoder, FlatEncoder
    )  # the default is the space's own encoder, as before


def test_dict_spaces_concatenate_their_keys_and_never_read_the_action_mask():
    space = spaces.Dict(
        {
            "observation": spaces.Box(-1, 1, (5,), np.float32),
            "position": spaces.Discrete(3),
            "action_mask": spaces.MultiBinary(4),
        }
    )
    encoder = make_encoder(space, hidden_sizes=(8,))
    assert isinstance(encoder, DictEncoder) and set(encoder.encoders) == {"observation", "position"}
    assert encoder.output_dim == 16
    obs = {
        "observation": torch.rand(B, 5),
        "position": torch.tensor([0, 1, 2, 0, 1]),
        "action_mask": torch.ones(B, 4),
    }
    features = encoder(obs)
    assert features.shape == (B, 16)
    obs["action_mask"] = torch.zeros(B, 4)  # the mask is not an input
    assert torch.equal(encoder(obs), features)
    with pytest.raises(ValueError, match="nothing to encode"):
        make_encoder(spaces.Dict({"action_mask": spaces.MultiBinary(2)}))


def test_dqn_learns_on_image_observations():
    space = spaces.Box(0, 255, (1, 6, 6), np.uint8)
    policy = DQNPolicy({"model": {"hidden_sizes": [32]}}, space, spaces.Discrete(3), seed=0)
    batch = ReplaySamples(
        obs=_batch(space),
        action=torch.tensor([0, 1, 2, 0, 1]),
        reward=torch.ones(B),
        next_obs=_batch(space),
        terminated=torch.zeros(B),
    )
    losses = [policy.learn_mode.forward(batch)["loss"] for _ in range(30)]
    assert losses[-1] < losses[0]
    assert policy.eval_mode.forward(batch.obs, None)["action"].shape == (B,)


def test_ppo_eval_mode_samples_when_not_deterministic():
    """eval.deterministic false: evaluation acts by sampling the policy (SB3's
    evaluate_policy(deterministic=False)); true, the default, by its mode."""
    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    obs = torch.zeros(256, 3)
    greedy = PPOPolicy(None, obs_space, spaces.Discrete(4), seed=0)
    assert len(set(greedy.eval_mode.forward(obs, None)["action"].tolist())) == 1
    sampled = PPOPolicy({"eval": {"deterministic": False}}, obs_space, spaces.Discrete(4), seed=0)
    assert len(set(sampled.eval_mode.forward(obs, None)["action"].tolist())) == 4
