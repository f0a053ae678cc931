"""Collate a list of nested samples into tensors; batches of observations."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

from mistk_rl.rl.data.collate import (
    batch_len,
    batch_rows,
    concat,
    default_collate,
    stack_observations,
)

Pair = namedtuple("Pair", "left right")


def sample(i: int) -> dict:
    return {
        "obs": np.full((2, 3), i, dtype=np.float64),
        "frame": np.full(4, i, dtype=np.uint8),
        "action": i,
        "reward": i / 2,
        "done": i % 2 == 0,
        "flag": np.bool_(i > 0),
        "logit": torch.full((2,), float(i), dtype=torch.float64),
        "nested": {"h": np.int32(i), "pair": (np.arange(2) + i, f"name{i}")},
        "named": Pair(left=float(i), right=None),
        "vec": [i, i + 1],
        "id": f"item{i}",
        "info": None,
    }


def test_collate_structure_and_dtypes():
    batch = default_collate([sample(i) for i in range(3)])
    assert batch["obs"].shape == (3, 2, 3) and batch["obs"].dtype == torch.float32
    assert batch["frame"].dtype == torch.uint8  # images stay 8-bit
    assert batch["action"].dtype == torch.int64 and batch["action"].tolist() == [0, 1, 2]
    assert batch["reward"].dtype == torch.float32 and batch["reward"].tolist() == [0, 0.5, 1]
    assert batch["done"].dtype == torch.bool and batch["done"].tolist() == [True, False, True]
    assert batch["flag"].dtype == torch.bool
    assert batch["logit"].dtype == torch.float32 and batch["logit"].shape == (3, 2)
    assert batch["nested"]["h"].dtype == torch.int64
    pair = batch["nested"]["pair"]
    assert isinstance(pair, tuple) and pair[0].shape == (3, 2)
    assert pair[1] == ["name0", "name1", "name2"]
    assert isinstance(batch["named"], Pair) and batch["named"].right == [None, None, None]
    assert batch["vec"].tolist() == [[0, 1], [1, 2], [2, 3]]
    assert batch["id"] == ["item0", "item1", "item2"] and batch["info"] == [None] * 3


def test_collate_errors():
    with pytest.raises(ValueError, match="non-empty"):
        default_collate([])
    with pytest.raises(ValueError, match="keys"):
        default_collate([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match="obs"):
        default_collate([{"obs": np.zeros(2)}, {"obs": np.zeros(3)}])


def test_batches_of_dict_observations_stack_index_and_join_per_key():
    observations = [
        {"cue": np.full(2, i, np.float32), "planes": np.full((3, 3), i, np.uint8)} for i in range(4)
    ]
    batch = stack_observations(observations)
    assert batch["planes"].dtype == torch.uint8 and batch["cue"].shape == (4, 2)
    assert batch_len(batch) == 4 and batch_len(batch["cue"]) == 4
    rows = batch_rows(batch, torch.tensor([3, 1]))
    assert rows["planes"][:, 0, 0].tolist() == [3, 1] and rows["cue"][:, 0].tolist() == [3, 1]
    joined = concat([batch, rows])
    assert joined["planes"].shape == (6, 3, 3) and joined["planes"].dtype == torch.uint8
    assert torch.equal(concat([batch["cue"], rows["cue"]]), joined["cue"])
    plain = stack_observations([np.zeros(2), np.ones(2)])
    assert plain.shape == (2, 2) and batch_rows(plain, 1).tolist() == [1.0, 1.0]
