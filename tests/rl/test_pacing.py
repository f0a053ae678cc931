"""Pacing (issue 23, item 3): the updates a trainer owes are paid a bounded amount per
request, or on a learner thread beside the requests; no timing assertions (a fake clock
drives the time guard)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from mistk_rl.rl.config import AgentConfigError
from mistk_rl.rl.data.buffers import NaiveReplayBuffer
from mistk_rl.rl.learner import Hook, Learner, load_checkpoint, save_checkpoint
from mistk_rl.rl.pacing import BackgroundPacer, Pacer
from mistk_rl.rl.policies.dqn import DQNPolicy
from mistk_rl.rl.policies.ppo import PPOPolicy
from mistk_rl.rl.trainers import OffPolicyTrainer, OnPolicyTrainer

OBS = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
# what the trainers pay is counted here, so the time guard (the one place timing changes
# what runs: `mistk_rl.rl.pacing`) is off unless a test turns it on
UNTIMED = {"max_update_seconds_per_request": None}
ACT = spaces.Discrete(2)


def _transition(i: int) -> dict:
    return {
        "obs": np.full(4, i % 7 / 7, np.float32),
        "action": torch.tensor(i % 2),
        "reward": 1.0,
        "next_obs": np.full(4, (i + 1) % 7 / 7, np.float32),
        "terminated": i % 9 == 8,
        "truncated": False,
    }


def _dqn(train: dict, seed: int = 0) -> OffPolicyTrainer:
    policy = DQNPolicy({"learn": {"batch_size": 4}}, OBS, ACT, seed=seed)
    return OffPolicyTrainer(
        policy,
        Learner(policy.learn_mode),
        NaiveReplayBuffer({"replay_buffer_size": 100}, seed=seed),
        {**UNTIMED, **train},
    )


def _step(trainer, i: int) -> int:
    """One request: one env step's transition, then what the trainer pays."""
    trainer.learner.env_steps += 1
    trainer.observe_all({"e": _transition(i)})
    return trainer.maybe_train()


def test_debt_is_paid_over_requests_at_most_updates_per_request_each():
    trainer = _dqn(
        {"learning_starts": 10, "train_freq": 10, "gradient_steps": 25, "updates_per_request": 8}
    )
    paid = [_step(trainer, i) for i in range(30)]
    # 25 owed at env steps 10, 20 and 30, paid 8, 8, 8, 1 in the requests from there on
    assert paid[9:13] == [8, 8, 8, 1] and paid[19:23] == [8, 8, 8, 1] and paid[29] == 8
    assert max(paid) == 8 and sum(paid) == 58 == trainer.learner.train_iter
    assert trainer.progress()["updatesOwed"] == 17


def test_requests_that_bring_many_env_steps_pay_what_they_bring():
    """A request of many env copies owes more than updates_per_request: the bound follows
    the owed rate (twice its mean per request), so the debt stays bounded."""
    trainer = _dqn(
        {"learning_starts": 10, "train_freq": 10, "gradient_steps": 10, "updates_per_request": 2}
    )
    owed = []
    for request in range(40):  # 8 env steps per request: 8 owed per request on average
        for i in range(8):
            trainer.learner.env_steps += 1
            trainer.observe_all({f"e{i}": _transition(request * 8 + i)})
        trainer.maybe_train()
        owed.append(trainer.progress()["updatesOwed"])
    assert max(owed) <= 20 and owed[-1] <= 10  # a fixed bound of 2 would owe 240 by now
    assert trainer.pacer.requests == 40


def test_updates_paid_at_once_when_the_bound_allows_are_the_same_updates():
    """Paying a burst over several requests runs the same steps on the same samples as
    paying it at once when no transition arrives in between; the weights match."""

    def weights(limit: int) -> list[torch.Tensor]:
        trainer = _dqn(
            {
                "learning_starts": 10,
                "train_freq": 10,
                "gradient_steps": 12,
                "updates_per_request": limit,
            }
        )
        for i in range(10):
            _step(trainer, i)
        while trainer.owed():
            trainer.maybe_train()  # requests that bring nothing new
        assert trainer.learner.train_iter == 12
        return [p.detach().clone() for p in trainer.policy.model.parameters()]

    for a, b in zip(weights(100), weights(5)):
        assert torch.equal(a, b)


def test_dqn_pays_its_default_burst_in_the_request_it_falls_due():
    """SB3 trains `gradient_steps` at once after every `train_freq` env steps; DQN's
    default bound pays its default burst (128) the same way, so no env step acts on a
    network half way through an update."""
    train = OffPolicyTrainer.default_config()
    assert train["updates_per_request"] >= train["gradient_steps"]
    trainer = _dqn(
        {**train, "learning_starts": 10, "train_freq": 10, "max_update_seconds_per_request": None}
    )  # (no clock in this test)
    paid = [_step(trainer, i) for i in range(25)]
    assert paid[9] == paid[19] == train["gradient_steps"]  # at env steps 10 and 20
    assert sum(paid) == 2 * train["gradient_steps"] and trainer.owed() == 0
    assert OnPolicyTrainer.default_config()["updates_per_request"] == 16  # PPO: unchanged


class FakeClock:
    """Seconds that move only when a step runs: `per_step` each."""

    def __init__(self, per_step: float) -> None:
        self.now, self.per_step = 0.0, per_step

    def __call__(self) -> float:
        return self.now


def test_time_budget_stops_paying_early_and_is_reported():
    trainer = _dqn(
        {
            "learning_starts": 10,
            "train_freq": 10,
            "gradient_steps": 20,
            "updates_per_request": 16,
            "max_update_seconds_per_request": 1.0,
        }
    )
    clock = FakeClock(per_step=0.4)
    trainer.pacer.clock = clock

    class Tick(Hook):  # every step "takes" 0.4 s
        def __call__(self, learner):
            clock.now += clock.per_step

    trainer.learner.register_hook(Tick("after_iter"))
    paid = [_step(trainer, i) for i in range(10)]
    # 0.4 and 0.8 s: a third step; 1.2 s: the guard stops before the fourth
    assert paid[-1] == 3 and trainer.progress()["updatesOwed"] == 17
    assert trainer.progress()["updateBudgetHits"] == 1
    clock.per_step = 2.0  # a step slower than the whole budget: one per request, still
    assert trainer.maybe_train() == 1 and trainer.progress()["updateBudgetHits"] == 2


def test_a_buffer_short_of_a_batch_drops_what_is_due():
    policy = DQNPolicy({"learn": {"batch_size": 50}}, OBS, ACT, seed=0)
    trainer = OffPolicyTrainer(
        policy,
        Learner(policy.learn_mode),
        NaiveReplayBuffer({"replay_buffer_size": 100}, seed=0),
        {"learning_starts": 1, "train_freq": 1, "gradient_steps": 2, **UNTIMED},
    )
    trainer.buffer.sample_batch = lambda size, learner_iter=0: None
    assert _step(trainer, 0) == 0 and trainer.owed() == 0


def _ppo_rollout(
    policy: PPOPolicy, trainer: OnPolicyTrainer, n: int, start: int = 0, requests: bool = True
) -> None:
    """`n` env steps, each its own request (`requests`: paying what it may, as an agent's
    step requests do) or all in one (the caller pays)."""
    for i in range(start, start + n):
        obs = np.full(4, i % 5 / 5, np.float32)
        out = policy.collect_mode.forward(torch.as_tensor(obs)[None], None, i)
        item = {k: v[0] for k, v in out.items() if isinstance(v, torch.Tensor) and v.dim()}
        t = policy.collect_mode.process_transition(obs, item, float(i % 3), obs, i % 7 == 6, False)
        trainer.learner.env_steps += 1
        trainer.observe_all({"e": t})
        if requests:
            trainer.maybe_train()


def _ppo(train: dict) -> tuple[PPOPolicy, OnPolicyTrainer]:
    policy = PPOPolicy({"learn": {"epochs": 3, "batch_size": 4}}, OBS, ACT, seed=0)
    return policy, OnPolicyTrainer(
        policy, Learner(policy.learn_mode), {"n_steps": 8, **UNTIMED, **train}
    )


def test_ppo_split_update_equals_the_one_shot_update():
    """A rollout's update paid 5 minibatch steps per request, nothing acted in between, gives
    bit-identical weights, optimiser state and info to the one-shot `Learner.train` (the
    shuffles are drawn when the rollout completes, in the order the one-shot loop draws
    them)."""
    policy, trainer = _ppo({"updates_per_request": 5})
    _ppo_rollout(policy, trainer, 7)
    reference = PPOPolicy({"learn": {"epochs": 3, "batch_size": 4}}, OBS, ACT, seed=0)
    reference.learn_mode.load_state_dict(policy.learn_mode.state_dict())
    reference.load_rng_state(policy.rng_state())
    _ppo_rollout(policy, trainer, 1, start=7, requests=False)
    batch = trainer._rollout_batch()  # (what the trainer freezes next)
    one_shot = Learner(reference.learn_mode).train(batch)
    paid = [trainer.maybe_train()]
    while trainer.owed():
        paid.append(trainer.maybe_train())
    assert paid == [5, 1]  # 3 epochs x 2 minibatches
    assert trainer.learner.train_iter == 1 and trainer.learner.last_info == one_shot
    for a, b in zip(policy.model.parameters(), reference.model.parameters()):
        assert torch.equal(a, b)


def test_ppo_acts_between_minibatch_steps_and_queues_the_next_update():
    """Acting goes on between the steps of a frozen update (each transition keeps the
    log-prob of the weights that acted); a rollout completed meanwhile is frozen too and
    paid after it."""
    policy, trainer = _ppo({"updates_per_request": 1})
    _ppo_rollout(policy, trainer, 8)  # the 8th request freezes the update, pays one step
    assert trainer.owed() == 5 and trainer.learner.train_iter == 0
    _ppo_rollout(policy, trainer, 3, start=8)  # acting, one step paid per request
    assert trainer.learner.train_iter == 0 and trainer.owed() == 2
    _ppo_rollout(policy, trainer, 5, start=11, requests=False)  # a second rollout, then
    assert trainer.maybe_train() == 2  # one request: 12 owed over 12 requests, 2 per request
    assert trainer.learner.train_iter == 1 and trainer.owed() == 6  # the second is queued
    while trainer.owed():
        trainer.maybe_train()
    assert trainer.learner.train_iter == 2


def test_debt_and_plans_round_trip_through_state_dict(tmp_path):
    """A checkpoint taken with steps owed resumes paying exactly what the original pays."""

    def run(restore_after: int | None) -> list[torch.Tensor]:
        policy, trainer = _ppo({"updates_per_request": 2})
        _ppo_rollout(policy, trainer, 8)  # the last request pays 2 of the 6 steps
        if restore_after is not None:
            save_checkpoint(
                {
                    "trainer": trainer.state_dict(),
                    "learner": trainer.learner.state_dict(),
                    "rng": policy.rng_state(),
                },
                tmp_path / "c.pt",
            )
            state = load_checkpoint(tmp_path / "c.pt")
            policy, trainer = _ppo({"updates_per_request": 2})
            trainer.learner.load_state_dict(state["learner"])
            policy.load_rng_state(state["rng"])
            trainer.load_state_dict(state["trainer"])
            assert trainer.owed() == 4
        while trainer.owed():
            trainer.maybe_train()
        assert trainer.learner.train_iter == 1
        return [p.detach().clone() for p in policy.model.parameters()]

    for a, b in zip(run(None), run(1)):
        assert torch.equal(a, b)
    dqn = _dqn(
        {"learning_starts": 10, "train_freq": 10, "gradient_steps": 25, "updates_per_request": 8}
    )
    for i in range(10):
        _step(dqn, i)
    resumed = _dqn(
        {"learning_starts": 10, "train_freq": 10, "gradient_steps": 25, "updates_per_request": 8}
    )
    resumed.load_state_dict(dqn.state_dict())
    assert resumed.owed() == dqn.owed() == 17


def test_pacing_config_is_checked():
    for bad, match in (
        ({"learn_in": "thread"}, "learn_in"),
        ({"updates_per_request": 0}, "updates_per_request"),
        ({"max_update_seconds_per_request": -1}, "max_update_seconds"),
    ):
        for trainer_cls in (OffPolicyTrainer, OnPolicyTrainer):
            with pytest.raises(AgentConfigError, match=match):
                trainer_cls.agent_config({"train": bad})
    assert OffPolicyTrainer.agent_config({"train": {"max_update_seconds_per_request": None}})


def test_background_learning_runs_beside_requests_and_stops_cleanly():
    before = set(threading.enumerate())
    trainer = _dqn(
        {"learning_starts": 10, "train_freq": 10, "gradient_steps": 30, "learn_in": "background"}
    )
    acting = trainer.pacer.acting
    assert isinstance(trainer.pacer, BackgroundPacer) and trainer.policy is not acting
    start = [p.detach().clone() for p in acting.model.parameters()]
    done = threading.Event()

    class Done(Hook):
        def __call__(self, learner):
            if learner.train_iter == 30:
                done.set()

    trainer.learner.register_hook(Done("after_iter"))
    for i in range(10):
        _step(trainer, i)  # the 10th hands 30 steps to the thread
    assert done.wait(60)
    with trainer.paused():
        assert trainer.owed() == 0
    trainer.maybe_train()  # a request takes the newest weights into the acting policy
    learned = [p.detach() for p in trainer.policy.model.parameters()]
    for a, b, c in zip(acting.model.parameters(), learned, start):
        assert torch.equal(a.detach(), b) and not torch.equal(b, c)
    assert trainer.progress()["learnIn"] == "background"
    trainer.close()
    assert set(threading.enumerate()) == before  # no thread left behind
    trainer.close()  # twice: nothing more


def test_background_step_that_fails_fails_the_next_request():
    trainer = _dqn(
        {"learning_starts": 2, "train_freq": 2, "gradient_steps": 1, "learn_in": "background"}
    )
    failed = threading.Event()

    def broken(batch):
        failed.set()
        raise ValueError("boom")

    trainer.learner.learn_mode = trainer.learner.learn_mode._replace(forward=broken)
    # requests go on until one raises: the first after the thread recorded its error (it
    # may be recorded between any two requests once the thread has debt)
    with pytest.raises(RuntimeError, match="boom"):
        for i in range(50):
            _step(trainer, i)
            if failed.wait(5 if i >= 3 else 0):
                trainer.pacer._thread.join(60)  # (it ends after recording the error)
    assert failed.is_set() and i <= 4
    trainer.close()


def test_request_pacer_needs_no_thread():
    trainer = _dqn({"learning_starts": 1, "train_freq": 1, "gradient_steps": 1})
    assert type(trainer.pacer) is Pacer and trainer.progress()["learnIn"] == "request"


# ---- through the agent (in-process, real CartPole copies: tests/rl/test_checkpoints.py) ----
from tests.rl.test_checkpoints import (  # noqa: E402 - this part of the file needs them
    DQN_HP,
    PPO_HP,
    Envs,
    _agent,
    _counters,
    _same_weights,
)


def test_ppo_agent_resumed_mid_update_pays_the_rest_as_the_original(tmp_path):
    """One minibatch step per request: a saveModel taken while an update is half paid
    resumes it, and the two runs act and learn alike from there (seeded, reproducible)."""
    hp = {**PPO_HP, "train": {**PPO_HP["train"], "updates_per_request": 1}}
    original = _agent(PPOAgent, hp, tmp_path / "a")
    # a rollout (64 transitions) completes at request 32, which pays 1 of its 4 steps (and
    # no rollout is in progress: a checkpoint cuts those, so the runs would differ there)
    Envs(0).play(original, 32)
    assert original.progress()["updatesOwed"] == 3
    original.do_save_model(tmp_path / "a" / "ckpt.pt")
    restored = _agent(PPOAgent, {**hp, "seed": 7}, tmp_path / "b", tmp_path / "a" / "ckpt.pt")
    assert _counters(restored) == _counters(original)
    assert Envs(100).play(original, 80) == Envs(100).play(restored, 80)
    assert original.progress() == restored.progress() and original.progress()["updates"] == 3
    assert _same_weights(original, restored)


def test_agent_learning_in_background_saves_resumes_and_leaves_no_thread(tmp_path):
    before = set(threading.enumerate())
    hp = {**DQN_HP, "train": {**DQN_HP["train"], "learn_in": "background"}}
    agent = _agent(DQNAgent, hp, tmp_path / "a")
    Envs(0).play(agent, 100)
    assert agent.progress()["learnIn"] == "background"
    agent.do_save_model(tmp_path / "a" / "ckpt.pt")
    saved = load_checkpoint(tmp_path / "a" / "ckpt.pt")
    restored = _agent(DQNAgent, hp, tmp_path / "b", tmp_path / "a" / "ckpt.pt")
    # the restored agent acts with the weights it learned (the learner thread's copy's)
    for name, value in restored.policy.model.state_dict().items():
        assert torch.equal(value, saved["learner"]["policy"]["model"][name])
    Envs(100).play(restored, 20)
    for each in (agent, restored):
        each.do_terminate()
    assert set(threading.enumerate()) == before
