"""Observation encoders, chosen by the observation space (`make_encoder`).

Each takes a batch of raw observations as they come from the env (indices, flat or image
arrays, or a dict of those) and returns features [B, output_dim]:

- `FlatEncoder`: Discrete observations one-hot (an index is a category, not a magnitude);
  Box, MultiBinary and MultiDiscrete flattened; then an MLP.
- `ImageEncoder`: image-like Box spaces (uint8, 0..255, C x H x W or H x W x C with 1, 3 or 4
  channels, as SB3's `is_image_space`): scaled to [0, 1], a small CNN (the Nature DQN stack
  for images of 36 px and more, two 3x3 convolutions below that), then one linear layer.
  With ``encoder: conv`` (the model config) any rank-3 Box takes it as it is, unscaled: a
  board game's planes (connect four's 6 x 7 x 2), where a convolution sees a line of four
  wherever it lies and an MLP must learn each place apart.
- `DictEncoder`: one encoder per key, features concatenated. A key named ``action_mask`` is
  the action mask (PettingZoo's ``{"observation", "action_mask"}``), never an input.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence, TypeGuard, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

Activation = str | type[nn.Module]
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}


def activation_class(activation: Activation) -> type[nn.Module]:
    """An activation class from its config name ("relu", "tanh", ...) or the class itself."""
    if isinstance(activation, str):
        try:
            return ACTIVATIONS[activation.lower()]
        except KeyError:
            raise ValueError(
                f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}"
            ) from None
    return activation


Layer = TypeVar("Layer", bound=nn.Linear | nn.Conv2d)


def layer_init(layer: Layer, gain: float = math.sqrt(2), bias: float = 0.0) -> Layer:
    """Orthogonal weights and constant bias: the initialisation CleanRL's PPO relies on."""
    nn.init.orthogonal_(layer.weight, gain)
    if layer.bias is not None:  # (a convolution may be built without one)
        nn.init.constant_(layer.bias, bias)
    return layer


class MLP(nn.Module):
    """Linear layers with an activation after each hidden one; `out_dim` adds a final linear
    layer without activation (logits, values). `output_dim` is the width of the output."""

    def __init__(
        self,
        in_dim: int,
        hidden_sizes: Sequence[int],
        activation: Activation = nn.ReLU,
        out_dim: int | None = None,
    ) -> None:
        super().__init__()
        act = activation_class(activation)
        layers: list[nn.Module] = []
        width = in_dim
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), act()]
            width = size
        if out_dim is not None:
            layers.append(nn.Linear(width, out_dim))
            width = out_dim
        self.net = nn.Sequential(*layers)
        self.output_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # each layer's forward, not its __call__: the call's hook handling costs ~3 us a
        # layer, as much as a small layer's math, on every env step's forward pass (no
        # module here has hooks; `net` is what to call to have them run)
        for layer in self.net:
            x = layer.forward(x)
        return x


ACTION_MASK_KEY = "action_mask"
IMAGE_CHANNELS = (1, 3, 4)


ENCODERS = ("auto", "conv")  # the model config's `encoder`: by the space, or planes as images


class Encoder(nn.Module):
    """What `make_encoder` builds: raw observations -> features [B, output_dim]."""

    output_dim: int


def make_encoder(
    space: spaces.Space,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: Activation = "relu",
    kind: str = "auto",
) -> Encoder:
    """The encoder for `space`; its `output_dim` is the feature width. `kind` "conv": a
    rank-3 Box that is no image (a board's planes) goes through the CNN too (module doc)."""
    if kind not in ENCODERS:
        raise ValueError(f"unknown encoder {kind!r}; valid: {', '.join(ENCODERS)}")
    if isinstance(space, spaces.Dict):
        return DictEncoder(space, hidden_sizes, activation, kind)
    if is_image_space(space) or (kind == "conv" and is_planes(space)):
        return ImageEncoder(
            space, feature_dim=hidden_sizes[-1] if hidden_sizes else 256, activation=activation
        )
    return FlatEncoder(space, hidden_sizes, activation)


def is_planes(space: spaces.Space) -> TypeGuard[spaces.Box]:
    """A rank-3 Box: an image, or planes of a board (H x W x C or C x H x W)."""
    return isinstance(space, spaces.Box) and len(space.shape) == 3


def is_image_space(space: spaces.Space) -> TypeGuard[spaces.Box]:
    return (
        is_planes(space)
        and space.dtype == np.uint8
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
        and (space.shape[0] in IMAGE_CHANNELS or space.shape[-1] in IMAGE_CHANNELS)
    )


def flat_dim(space: spaces.Space) -> int:
    """Width of a space's flat encoding: n for Discrete, the number of values otherwise."""
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
        return int(np.prod(space.shape))
    raise TypeError(f"no flat encoding for observation space {space}")


class FlatEncoder(Encoder):
    def __init__(
        self,
        space: spaces.Space,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: Activation = "relu",
    ) -> None:
        super().__init__()
        self.in_dim = flat_dim(space)
        self.mlp = MLP(self.in_dim, hidden_sizes, activation)
        self.output_dim = self.mlp.output_dim
        self._start = int(space.start) if isinstance(space, spaces.Discrete) else 0
        self._one_hot = isinstance(space, spaces.Discrete)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        obs = torch.as_tensor(obs)
        if self._one_hot:
            x = F.one_hot(obs.long().reshape(-1) - self._start, self.in_dim).float()
        else:
            x = obs.reshape(obs.shape[0], -1).float()
        return self.mlp(x)


class ImageEncoder(Encoder):
    def __init__(
        self, space: spaces.Box, feature_dim: int = 256, activation: Activation = "relu"
    ) -> None:
        super().__init__()
        image = is_image_space(space)
        # an image's channels are 1, 3 or 4; a board's planes are fewer than its rows
        channels_last = (
            space.shape[0] not in IMAGE_CHANNELS if image else space.shape[-1] <= space.shape[0]
        )
        self.channels_last = channels_last
        self.scale = 1 / 255.0 if image else 1.0
        c, h, w = (space.shape[2], space.shape[0], space.shape[1]) if channels_last else space.shape
        act = activation_class(activation)
        if min(h, w) >= 36:  # the Nature DQN stack (Mnih et al. 2015)
            convs = [
                nn.Conv2d(c, 32, 8, stride=4),
                act(),
                nn.Conv2d(32, 64, 4, stride=2),
                act(),
                nn.Conv2d(64, 64, 3, stride=1),
                act(),
            ]
        else:  # small images (grid worlds, MinAtar-sized): keep the resolution
            convs = [nn.Conv2d(c, 16, 3, padding=1), act(), nn.Conv2d(16, 32, 3, padding=1), act()]
        self.cnn = nn.Sequential(*convs, nn.Flatten())
        with torch.device("meta"):  # the flattened width, without computing anything
            n_flat = self.cnn(torch.zeros(1, c, h, w)).shape[1]
        self.linear = nn.Sequential(nn.Linear(n_flat, feature_dim), act())
        self.output_dim = feature_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(obs).float() * self.scale
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.linear(self.cnn(x))


class DictEncoder(Encoder):
    def __init__(
        self,
        space: spaces.Dict,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: Activation = "relu",
        kind: str = "auto",
    ) -> None:
        super().__init__()
        keys = [k for k in space.spaces if k != ACTION_MASK_KEY]
        if not keys:
            raise ValueError(f"{space} has nothing to encode but an action mask")
        encoders = {k: make_encoder(space[k], hidden_sizes, activation, kind) for k in keys}
        self.encoders = nn.ModuleDict(encoders)
        self.output_dim = sum(e.output_dim for e in encoders.values())

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([encoder(obs[key]) for key, encoder in self.encoders.items()], dim=1)
