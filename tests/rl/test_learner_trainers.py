"""Learner hooks and the two trainers' schedules."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from mistk_rl.rl.data.buffers import AdvancedReplayBuffer, NaiveReplayBuffer
from mistk_rl.rl.learner import CheckpointHook, Hook, Learner, LearnMode, LogHook, load_checkpoint
from mistk_rl.rl.policies.dqn import DQNPolicy
from mistk_rl.rl.policies.ppo import PPOPolicy, explained_variance
from mistk_rl.rl.trainers import OffPolicyTrainer, OnPolicyTrainer

OBS = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
ACT = spaces.Discrete(2)


def _fake_learn_mode(calls: list) -> LearnMode:
    weights = {"w": torch.zeros(3)}

    def forward(batch):
        calls.append(batch)
        weights["w"] += 1
        return {"loss": float(len(calls)), "vector": np.ones(2)}

    return LearnMode(
        forward, lambda: {"w": weights["w"].clone()}, lambda s: weights.update(w=s["w"])
    )


class Note(Hook):
    """Notes `label(learner)` in `seen` each time it runs."""

    def __init__(self, position, seen, label, every=1):
        super().__init__(position, every)
        self.seen, self.label = seen, label

    def __call__(self, learner):
        self.seen.append(self.label(learner))


def test_hooks_run_at_their_positions_and_frequency():
    calls, seen = [], []
    learner = Learner(
        _fake_learn_mode(calls),
        [
            Note("before_run", seen, lambda lr: "before_run"),
            Note("after_iter", seen, lambda lr: f"iter{lr.train_iter}", every=2),
            Note("after_run", seen, lambda lr: "after_run"),
        ],
    )
    for _ in range(5):
        learner.train({})
    learner.close()
    assert seen == ["before_run", "iter2", "iter4", "after_run"]
    with pytest.raises(ValueError, match="valid: before_run"):
        Hook("sometimes")


def test_checkpoint_and_log_hooks(tmp_path):
    calls = []
    learner = Learner(
        _fake_learn_mode(calls),
        [
            CheckpointHook(tmp_path / "ckpt.pt", every=3),
            CheckpointHook(
                tmp_path / "agent.pt",
                every=3,
                state=lambda: {"learner": learner.state_dict(), "note": "x"},
            ),
            LogHook(tmp_path / "logs", every=2),
        ],
    )
    for _ in range(6):
        learner.env_steps += 10  # (collected between updates)
        learner.train({})
    learner.close()
    state = load_checkpoint(tmp_path / "ckpt.pt")  # weights_only
    assert state["train_iter"] == 6
    assert torch.equal(state["policy"]["w"], torch.full((3,), 6.0))
    assert load_checkpoint(tmp_path / "agent.pt")["learner"]["train_iter"] == 6
    rows = list(csv.DictReader(open(tmp_path / "logs" / "learner.csv")))
    assert [r["train_iter"] for r in rows] == ["2", "4", "6"]
    assert rows[0]["env_steps"] == "20" and "vector" not in rows[0]
    # TensorBoard's x axis is env steps (as the harness's eval scalars): charts line up
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "logs"))
    events.Reload()
    iters = events.Scalars("learner/train_iter")
    assert [(e.step, e.value) for e in iters] == [(20, 2.0), (40, 4.0), (60, 6.0)]


def _transition(i: int, done: bool = False) -> dict:
    return {
        "obs": np.full(4, i, np.float32),
        "action": torch.tensor(i % 2),
        "reward": 1.0,
        "next_obs": np.full(4, i + 1, np.float32),
        "terminated": done,
        "truncated": False,
    }


def test_off_policy_trainer_schedule():
    policy = DQNPolicy({"learn": {"batch_size": 4}}, OBS, ACT, seed=0)
    learner = Learner(policy.learn_mode)
    buffer = NaiveReplayBuffer({"replay_buffer_size": 100}, seed=0)
    trainer = OffPolicyTrainer(
        policy, learner, buffer, {"learning_starts": 10, "train_freq": 5, "gradient_steps": 3}
    )
    updates = []
    for i in range(30):
        learner.env_steps += 1
        trainer.observe("e", _transition(i, done=(i % 9 == 8)))
        updates.append(trainer.maybe_train())
    assert buffer.count() == 30
    # nothing before learning_starts, then 3 updates every 5 env steps
    assert [i + 1 for i, u in enumerate(updates) if u] == [10, 15, 20, 25, 30]
    assert learner.train_iter == 15 and set(updates) == {0, 3}


def test_off_policy_trainer_feeds_priorities_back():
    policy = DQNPolicy({"learn": {"batch_size": 8}}, OBS, ACT, seed=0)
    learner = Learner(policy.learn_mode)
    buffer = AdvancedReplayBuffer({"replay_buffer_size": 64}, seed=0)
    trainer = OffPolicyTrainer(
        policy, learner, buffer, {"learning_starts": 1, "train_freq": 1, "gradient_steps": 1}
    )
    for i in range(32):
        learner.env_steps += 1
        trainer.observe("e", _transition(i))
        trainer.maybe_train()
    # the buffer refuses to sample until it holds a full batch (sample_min_limit_ratio 1)
    assert learner.train_iter == 32 - 7
    assert buffer.stats()["max_priority"] != 1.0  # TD errors replaced the initial priority


def test_nstep_reaches_the_buffer():
    policy = DQNPolicy({"nstep": 3, "learn": {"batch_size": 2, "gamma": 0.5}}, OBS, ACT, seed=0)
    learner = Learner(policy.learn_mode)
    buffer = NaiveReplayBuffer({"replay_buffer_size": 10}, seed=0)
    trainer = OffPolicyTrainer(
        policy, learner, buffer, {"learning_starts": 100, "train_freq": 1, "gradient_steps": 1}
    )
    for i in range(4):
        trainer.observe("e", _transition(i))
    first = min(buffer.sample(2), key=lambda t: t["obs"][0])
    assert first["reward"] == pytest.approx(1 + 0.5 + 0.25) and first["gamma_n"] == 0.125


def _recording_trainer(
    policy: PPOPolicy, hooks: list = ()
) -> tuple[OnPolicyTrainer, Learner, list]:
    """An on-policy trainer of 8-step rollouts whose learner records every rollout batch it
    plans an update of."""
    batches = []
    learner = Learner(policy.learn_mode, list(hooks))
    original = learner.learn_mode.plan
    learner.learn_mode = learner.learn_mode._replace(
        plan=lambda b: batches.append(b) or original(b)
    )
    return OnPolicyTrainer(policy, learner, {"n_steps": 8}), learner, batches


def test_on_policy_trainer_trains_every_n_steps_with_bootstrapped_gae():
    policy = PPOPolicy({"learn": {"epochs": 1, "batch_size": 8}}, OBS, ACT, seed=0)
    trainer, learner, batches = _recording_trainer(
        policy, [Note("before_iter", [], lambda lr: None)]
    )
    obs = torch.zeros(1, 4)
    for i in range(16):
        out = policy.collect_mode.forward(obs, None, i)
        item = {k: v[0] for k, v in out.items() if isinstance(v, torch.Tensor) and v.dim()}
        t = policy.collect_mode.process_transition(
            np.zeros(4, np.float32), item, 1.0, np.zeros(4, np.float32), False, i == 5
        )
        learner.env_steps += 1
        trainer.observe("e", t)
        trainer.maybe_train()
    assert len(batches) == 2 and all(len(b.advantage) == 8 for b in batches)
    assert [b.env_steps for b in batches] == [8, 16]
    batch = batches[0]
    value = batch.value
    # no termination: every delta bootstraps from V(next_obs) (same obs here, so V(s))
    delta = 1.0 + 0.98 * value - value  # (every reward is 1)
    # step 5 is truncated: its advantage is its delta alone (the recursion stops there)
    assert batch.advantage[5].item() == pytest.approx(delta[5].item(), rel=1e-5)
    assert batch.returns[5].item() == pytest.approx(
        (batch.advantage[5] + value[5]).item(), rel=1e-5
    )


def test_gae_uses_the_value_function_of_now_for_every_step():
    """An update paid over the first requests of a rollout changes the weights while the
    rollout's first steps are acted: their recorded values are of other weights. GAE takes
    V(s) and V(s') of the weights the rollout ends with, never a mix."""
    from mistk_rl.rl.data.returns import gae

    policy = PPOPolicy({"learn": {"epochs": 1, "batch_size": 8}}, OBS, ACT, seed=0)
    trainer, learner, batches = _recording_trainer(policy)
    obs = [np.full(4, i / 10, np.float32) for i in range(9)]
    recorded = []
    for i in range(8):
        if i == 4:  # (what an update paid mid-rollout does to the value head)
            with torch.no_grad():
                policy.model.head.value.bias += 5.0
        out = policy.collect_mode.forward(torch.as_tensor(obs[i])[None], None, i)
        item = {k: v[0] for k, v in out.items() if isinstance(v, torch.Tensor) and v.dim()}
        recorded.append(float(item["value"]))
        trainer.observe(
            "e",
            policy.collect_mode.process_transition(obs[i], item, -1.0, obs[i + 1], False, False),
        )
        learner.env_steps += 1
    now = policy.value(np.stack(obs)).numpy()  # (before the update the rollout owes)
    trainer.maybe_train()
    (batch,) = batches
    zeros = np.zeros(8, np.float32)
    expected, _ = gae(
        np.full(8, -1.0, np.float32),
        now[:8],
        now[1:],
        zeros,
        zeros,
        0.98,
        policy.config["learn"]["gae_lambda"],
    )
    np.testing.assert_allclose(batch.advantage.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.value.numpy(), now[:8], rtol=1e-6)
    assert abs(recorded[0] - now[0]) > 4  # (the first steps' recorded values were stale)


def test_end_of_agent_episode_flushes_every_entity():
    policy = DQNPolicy({"nstep": 3, "learn": {"batch_size": 2}}, OBS, ACT, seed=0)
    learner = Learner(policy.learn_mode)
    buffer = NaiveReplayBuffer({"replay_buffer_size": 10}, seed=0)
    trainer = OffPolicyTrainer(
        policy, learner, buffer, {"learning_starts": 100, "train_freq": 1, "gradient_steps": 1}
    )
    for entity in ("a:0", "a:1"):
        for i in range(2):  # shorter than the n-step window: nothing emitted yet
            trainer.observe(entity, _transition(i))
    assert buffer.count() == 0
    trainer.end_all_episodes()
    assert buffer.count() == 4


def test_observe_all_stores_what_observing_one_by_one_stores():
    """Per entity, per env step, or all the steps at once (local inference's batch): the
    same items in the same slots, so a seeded sample draws the same batch."""

    def filled(how: str) -> list:
        policy = DQNPolicy({"nstep": 2, "learn": {"batch_size": 2}}, OBS, ACT, seed=0)
        buffer = NaiveReplayBuffer({"replay_buffer_size": 50}, seed=0)
        trainer = OffPolicyTrainer(
            policy,
            Learner(policy.learn_mode),
            buffer,
            {"learning_starts": 100, "train_freq": 1, "gradient_steps": 1},
        )
        steps = [{"a:0": _transition(i, done=i == 3), "a:1": _transition(10 + i)} for i in range(7)]
        if how == "steps":
            trainer.observe_steps(steps)
        for step in steps if how != "steps" else []:
            if how == "step":
                trainer.observe_all(step)
            else:
                for entity, transition in step.items():
                    trainer.observe(entity, transition)
        return [
            (float(t["obs"][0]), t["reward"], t["gamma_n"])
            for t in (buffer._ring.row(slot) for slot in range(buffer.count()))
        ]

    one_by_one = filled("entity")
    assert filled("step") == one_by_one and filled("steps") == one_by_one
    # a:0: its first episode (4), then 2 full windows of the next; a:1: 6 full windows
    assert len(one_by_one) == 4 + 2 + 6


def test_ppo_learns_under_the_action_mask_it_acted_under():
    """The rollout keeps each step's action mask, so the first minibatch's log-probs are the
    ones recorded when acting: ratio 1 (no KL, nothing clipped) before any update."""
    policy = PPOPolicy({"learn": {"epochs": 1, "batch_size": 8}}, OBS, spaces.Discrete(4), seed=0)
    trainer, learner, batches = _recording_trainer(policy)
    for i in range(8):
        mask = torch.tensor([[True, i % 2 == 0, True, False]])
        out = policy.collect_mode.forward(torch.zeros(1, 4), mask, i)
        item = {k: v[0] for k, v in out.items() if isinstance(v, torch.Tensor) and v.dim()}
        trainer.observe(
            "e",
            policy.collect_mode.process_transition(
                np.zeros(4, np.float32), item, 1.0, np.zeros(4, np.float32), False, False
            ),
        )
        learner.env_steps += 1
    trainer.maybe_train()
    (batch,) = batches
    assert batch.action_mask.shape == (8, 4) and not batch.action_mask[:, 3].any()
    assert learner.last_info["approx_kl"] == 0.0 and learner.last_info["clip_frac"] == 0.0
    # every step rewarded 1 and never ending: the returns vary with the untrained critic's
    # values, and its explained variance is reported with the update
    assert math.isfinite(learner.last_info["explained_variance"])


def test_explained_variance_of_the_critic_against_its_targets():
    returns = torch.tensor([1.0, -1.0, 0.5, 0.0])
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(torch.full((4,), returns.mean().item()), returns) == pytest.approx(0)
    assert explained_variance(-returns, returns) == pytest.approx(-3.0)  # worse than a constant
    assert math.isnan(explained_variance(torch.zeros(3), torch.ones(3)))  # nothing to explain


def test_ppo_refuses_a_transition_of_an_action_it_did_not_choose():
    policy = PPOPolicy(None, OBS, ACT, seed=0)
    with pytest.raises(ValueError, match="did not choose"):
        policy.collect_mode.process_transition(
            np.zeros(4, np.float32),
            {"action": torch.tensor(1)},
            1.0,
            np.zeros(4, np.float32),
            False,
            False,
        )


def test_each_policy_names_its_trainer_and_only_a_replay_warms_up():
    assert DQNPolicy.trainer_cls is OffPolicyTrainer and PPOPolicy.trainer_cls is OnPolicyTrainer
    for policy_cls in (DQNPolicy, PPOPolicy):
        policy = policy_cls(None, OBS, ACT, seed=0)
        config = {"policy": policy.config, **policy_cls.trainer_cls.agent_config({})}
        trainer = policy_cls.trainer_cls.from_agent_config(
            policy, Learner(policy.learn_mode), config, seed=0, normalizer=None, augment=None
        )
        assert trainer.warming_up == (policy_cls is DQNPolicy)
        assert ("bufferSize" in trainer.progress()) == (policy_cls is DQNPolicy)
