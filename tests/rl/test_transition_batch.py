"""n-step returns on columns (`NStepColumns`) give what one `NStepAccumulator` per entity gives,
fed the same steps one at a time: the same items, values and order."""

from __future__ import annotations

import numpy as np
import pytest

from mistk_rl.rl.data.transition_batch import NStepColumns, TransitionBatch
from tests.rl.nstep_reference import NStepAccumulator


def _stream(rng: np.random.Generator, entities: list[str], steps: int, masks: bool):
    """Batches of steps: each a few entities' next steps (some entities several, in order)."""
    t = {e: 0 for e in entities}
    for _ in range(steps):
        keys = list(rng.choice(entities, size=rng.integers(1, 6)))
        rows = []
        for key in keys:
            t[key] += 1
            end = rng.random()
            row = {
                "obs": np.array([t[key], hash(key) % 7], np.float32),
                "action": np.int64(rng.integers(3)),
                "reward": float(rng.normal()),
                "next_obs": np.array([t[key] + 1, hash(key) % 7], np.float32),
                "terminated": bool(end < 0.1),
                "truncated": bool(0.1 <= end < 0.15),
            }
            if masks:
                row["next_action_mask"] = rng.random(3) < 0.7
            rows.append(row)
        yield keys, rows


def _reference(batches, n, gamma, flush_at):
    accs: dict[str, NStepAccumulator] = {}
    out = []
    for step, (keys, rows) in enumerate(batches):
        for key, row in zip(keys, rows):
            acc = accs.setdefault(key, NStepAccumulator(n, gamma))
            out += acc.push(row)
        if step in flush_at:
            for acc in accs.values():
                out += acc.flush()
    return out, {k: a.pending() for k, a in accs.items() if len(a)}


def _columns(batches, n, gamma, flush_at):
    acc = NStepColumns(n, gamma)
    out = []
    for step, (keys, rows) in enumerate(batches):
        items = acc.push(keys, TransitionBatch.from_rows(rows))
        out += [] if items is None else items.rows()
        if step in flush_at:
            items = acc.flush()
            out += [] if items is None else items.rows()
    return out, acc.pending()


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("masks", [False, True])
def test_column_nstep_items_are_the_per_entity_accumulators_items(n, masks):
    rng = np.random.default_rng(n)
    batches = list(_stream(rng, ["a", "b", "c", "d"], 60, masks))
    want, want_pending = _reference(batches, n, 0.9, flush_at={20, 41})
    got, got_pending = _columns(batches, n, 0.9, flush_at={20, 41})
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in w:
            assert np.array_equal(g[key], w[key]), key  # (bit for bit: the same sums)
    assert got_pending.keys() == want_pending.keys()
    for key, rows in want_pending.items():
        assert [r["obs"].tolist() for r in got_pending[key]] == [r["obs"].tolist() for r in rows]


def test_flushing_some_entities_keeps_the_others_windows():
    acc = NStepColumns(3, 0.5)
    row = {"obs": 0.0, "reward": 1.0, "next_obs": 1.0, "terminated": False, "truncated": False}
    assert acc.push(["a", "b"], TransitionBatch.from_rows([row, row])) is None
    items = acc.flush(["b"])
    assert items is not None and len(items) == 1 and len(acc) == 1
    assert list(acc.pending()) == ["a"]
    assert acc.push(["a", "a"], TransitionBatch.from_rows([row, row])) is not None
    assert items.columns["gamma_n"].tolist() == [0.5]
