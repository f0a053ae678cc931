"""stepColumns: env copies as columns, each observation sent once, transitions assembled by
the agent's service from what it kept under each step id."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.dqn_agent import DQNAgent
from agents.ppo_agent import PPOAgent
from agents.random_agent import RandomAgent
from harness.bench.step import InProcessClient
from mistk_rl.errors import InvalidRequest, StepsReset
from mistk_rl.framework.agent import Acted, Acting
from mistk_rl.rl.envs import MANAGERS, make_env_fns
from mistk_rl.sdk.stepping import ColumnStepper, EntityStepper, StepOutcome
from mistk_rl.service.handlers import AgentService
from mistk_rl.service.steps import StepStore, entity_acting
from mistk_rl.spaces import space_to_dict
from mistk_rl.wire import codec
from tests.conftest import RANDOM_AGENT

CARTPOLE = gym.make("CartPole-v1")
SPACES = {
    "observationSpace": space_to_dict(CARTPOLE.observation_space),
    "actionSpace": space_to_dict(CARTPOLE.action_space),
}


class RecordingAgent(RandomAgent):
    """A RandomAgent that keeps every batch of transitions it is given."""

    def do_initialize(self, props, hparams) -> None:
        super().do_initialize(props, hparams)
        self.learned = []

    def do_learn(self, transitions) -> None:
        self.learned.append(transitions)


def _service(tmp_path, agent, hparams=None, spaces=SPACES) -> AgentService:
    service = AgentService(agent, tmp_path / type(agent).__name__)
    service.initialize({"hyperparameters": {"seed": 0, **(hparams or {})}})
    service.lifecycle.wait_for_state("initialized", 10)
    service.buildModel()
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered({"name": "p", **spaces})
    return service


def _obs(n: int, value: float) -> np.ndarray:
    return np.full((n, 4), value, np.float32)


# ---- the store ------------------------------------------------------------------------------
def test_the_store_gives_back_rows_by_step_id_in_any_order_across_batches():
    store = StepStore()
    first = store.put(_obs(3, 0) + np.arange(3)[:, None], Acted(np.array([0, 1, 0])))
    second = store.put(
        _obs(2, 10) + np.arange(2)[:, None], Acted(np.array([1, 1]), {"v": np.array([0.5, 0.6])})
    )
    ids = np.array([second[1], first[2], first[0]])
    kept = store.lookup(ids)
    assert kept.obs[:, 0].tolist() == [11, 2, 0] and kept.actions.tolist() == [1, 0, 0]
    assert kept.extras == {}  # the first batch has no extras: only what all rows have
    store.release(ids)
    with pytest.raises(InvalidRequest, match=f"step id {first[0]} is not one"):
        store.lookup(np.array([first[1], first[0]]))
    assert store.lookup(np.array([first[1], second[0]])).obs[:, 0].tolist() == [1, 10]
    assert len(store) == 2


def test_a_whole_batch_comes_back_as_it_was_kept():
    store = StepStore()
    ids = store.put(_obs(4, 1), Acted(np.arange(4), {"logp": np.ones(4)}))
    kept = store.lookup(ids)
    assert kept.extras["logp"].tolist() == [1, 1, 1, 1]
    store.release(ids)
    assert len(store) == 0
    with pytest.raises(InvalidRequest):
        store.lookup(ids)


def test_a_batch_named_in_another_order_with_the_same_ends_is_read_row_by_row():
    """Ids that start and end where their batch does but do not count up (the whole-batch
    shortcut must not take them) come back in the order named."""
    store = StepStore()
    ids = store.put(_obs(4, 0) + np.arange(4)[:, None], Acted(np.arange(4)))
    order = ids[[0, 2, 1, 3]]
    kept = store.lookup(order)
    assert kept.obs[:, 0].tolist() == [0, 2, 1, 3] and kept.actions.tolist() == [0, 2, 1, 3]
    store.release(order)
    assert len(store) == 0


def test_the_store_is_bounded_and_ids_never_repeat():
    store = StepStore(max_batches=2)
    old = store.put(_obs(1, 0), Acted(np.array([0])))
    later = [store.put(_obs(1, 0), Acted(np.array([0]))) for _ in range(2)]
    with pytest.raises(InvalidRequest, match="too old"):
        store.lookup(old)
    store.clear()
    assert store.put(_obs(1, 0), Acted(np.array([0])))[0] > later[-1][0]


def test_the_entity_form_matches_only_the_action_the_agent_chose():
    store = StepStore()
    store.put(
        np.zeros((2, 1)),
        Acted(np.array([[0.5], [0.25]]), {"logp": np.array([1.0, 2.0])}),
        names=["a", "b"],
    )
    matched, kept = store.match(["b", "a"], np.array([[0.25], [0.9]]))
    assert matched.tolist() == [True, False] and kept.extras["logp"][0] == 2.0
    store.forget(["a", "b"])
    assert len(store) == 0


def test_one_entity_travels_as_a_view_and_the_store_keeps_its_own_copy():
    obs = {"player": np.array([1.0, 2.0, 3.0, 4.0], np.float32)}
    acting = entity_acting(obs, None)
    assert acting.obs.shape == (1, 4) and np.shares_memory(acting.obs, obs["player"])
    store = StepStore()
    store.put(acting.obs, Acted(np.array([1])), acting.names)
    obs["player"][:] = -1.0  # the caller's array changes after the step
    _, kept = store.match(["player"], np.array([1]))
    assert kept.obs.tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_a_random_agent_draws_one_row_from_the_same_stream_as_many():
    one, many = RandomAgent(), RandomAgent()
    for agent in (one, many):
        agent.action_space = gym.spaces.Discrete(5, start=2)
        agent.action_space.seed(7)
    row = Acting(np.arange(1), _obs(1, 0.0), None)
    singles = [int(one.do_act(row).actions[0]) for _ in range(50)]
    batch = many.action_space.np_random.integers(0, 5, size=50) + 2
    assert singles == batch.tolist()


# ---- the service ----------------------------------------------------------------------------
def test_transitions_are_assembled_from_what_the_agent_acted_on(tmp_path):
    service = _service(tmp_path, RecordingAgent())
    agent = service.agent
    service.episodeStarted({"obs": {"p:0": [0, 0, 0, 0]}})
    first = service.stepColumns({"envs": [0, 1, 2], "obs": _obs(3, 1).tolist()})[0]
    assert agent.learned == [] and len(first["stepIds"]) == 3
    # copy 1's episode ended: obs holds where it ended, reset.obs what it acts on now;
    # copy 2 is done and only reports
    answer = service.stepColumns(
        {
            "envs": [0, 1, 2],
            "obs": _obs(3, 2).tolist(),
            "stepIds": first["stepIds"].tolist(),
            "rewards": [1.0, 2.0, 3.0],
            "terminated": [False, True, False],
            "truncated": [False, False, True],
            "act": [True, True, False],
            "reset": {"rows": [1], "obs": [[9, 9, 9, 9]]},
        }
    )[0]
    (learned,) = agent.learned
    assert learned.envs.tolist() == [0, 1, 2]
    assert learned.obs[:, 0].tolist() == [1, 1, 1]  # what each acted on
    assert learned.actions.tolist() == first["actions"].tolist()
    assert learned.next_obs[:, 0].tolist() == [2, 2, 2]
    assert learned.rewards.tolist() == [1, 2, 3]
    assert learned.terminated.tolist() == [False, True, False]
    assert learned.truncated.tolist() == [False, False, True]
    assert len(answer["actions"]) == 2 and answer["actions"].dtype == np.uint8
    kept = service.steps.lookup(answer["stepIds"])
    assert kept.obs[:, 0].tolist() == [2, 9]  # copy 1 acted on its reset observation


@pytest.mark.parametrize(
    "body, match",
    [
        ({"envs": [0, 0], "obs": [[0] * 4] * 2}, "distinct"),
        ({"envs": [0, 1], "obs": [[0] * 4]}, "1 rows, where envs has 2"),
        ({"envs": [0], "obs": [[0, 0, 0, float("nan")]]}, r"obs\[0\]: not every number"),
        ({"envs": [0], "obs": [[0, 0, 0]]}, r"shape \(3,\) is not \(4,\)"),
        (
            {
                "envs": [0],
                "obs": [[0] * 4],
                "stepIds": [12345],
                "rewards": [0],
                "terminated": [False],
            },
            "step id 12345 is not one",
        ),
        (
            {"envs": [0], "obs": [[0] * 4], "reset": {"rows": [1], "obs": [[0] * 4]}},
            r"reset.rows: distinct row indices in \[0, 1\)",
        ),
        ({"envs": [0], "obs": [[0] * 4], "actionMask": [[0, 0]]}, "allows no action"),
        ({"envs": [0], "obs": [[0] * 4], "act": [2]}, "one flag"),
    ],
)
def test_bad_columns_are_refused_and_change_nothing(tmp_path, body, match):
    service = _service(tmp_path, RecordingAgent())
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    ids = service.stepColumns({"envs": [0], "obs": [[0] * 4]})[0]["stepIds"]
    version, waiting = service.lifecycle.version, len(service.steps)
    with pytest.raises(InvalidRequest, match=match):
        service.stepColumns(body)
    assert service.lifecycle.version == version and len(service.steps) == waiting
    service.stepColumns(
        {
            "envs": [0],
            "obs": [[0] * 4],
            "stepIds": ids.tolist(),
            "rewards": [0],
            "terminated": [False],
        }
    )  # still waiting


def test_steps_from_before_a_reset_are_409_not_bad_input(tmp_path):
    """The lifecycle moved on: the ids a reset agent handed out are a conflict (409) naming
    the reset, not a 400 about the body; an id never handed out is still a 400."""
    service = _service(tmp_path, RecordingAgent())
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    old = service.stepColumns({"envs": [0], "obs": [[0] * 4]})[0]["stepIds"]
    service.reset()
    service.lifecycle.wait_for_state("started", 10)
    service = _registered_again(service)
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    report = {"envs": [0], "obs": [[0] * 4], "rewards": [0], "terminated": [False]}
    with pytest.raises(StepsReset, match="before the agent was reset"):
        service.stepColumns({**report, "stepIds": old.tolist()})
    with pytest.raises(InvalidRequest, match="is not one"):
        service.stepColumns({**report, "stepIds": [int(old[0]) + 1000]})
    fresh = service.stepColumns({"envs": [0], "obs": [[0] * 4]})[0]["stepIds"]
    assert int(fresh[0]) > int(old[0])
    service.stepColumns({**report, "stepIds": fresh.tolist()})


def _registered_again(service: AgentService) -> AgentService:
    service.initialize({"hyperparameters": {"seed": 0}})
    service.lifecycle.wait_for_state("initialized", 10)
    service.buildModel()
    service.lifecycle.wait_for_state("initialized", 10)
    service.agentRegistered({"name": "p", **SPACES})
    return service


def test_dict_observations_travel_one_column_per_key(tmp_path):
    space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
            "cell": gym.spaces.Box(0, 9, (3,), np.uint8),
        }
    )
    service = _service(
        tmp_path,
        RecordingAgent(),
        spaces={"observationSpace": space_to_dict(space), "actionSpace": SPACES["actionSpace"]},
    )
    service.episodeStarted({"obs": {"p": {"pos": [0, 0], "cell": [0, 0, 0]}}})
    body = {
        "envs": np.arange(2),
        "obs": {"pos": np.zeros((2, 2), np.float32), "cell": np.ones((2, 3), np.uint8)},
    }
    ids = service.stepColumns(codec.decode(codec.encode(body, columns=True)))[0]["stepIds"]
    service.stepColumns(
        {
            "envs": [0, 1],
            "obs": {"pos": [[0, 0]] * 2, "cell": [[2] * 3] * 2},
            "stepIds": ids.tolist(),
            "rewards": [0, 0],
            "terminated": [False, False],
        }
    )
    (learned,) = service.agent.learned
    assert learned.obs["cell"].dtype == np.uint8 and learned.next_obs["cell"][0, 0] == 2
    with pytest.raises(InvalidRequest, match="one column per key"):
        service.stepColumns({"envs": [0], "obs": {"pos": [[0, 0]]}})


def test_a_ppo_agent_learns_from_columns_with_what_it_said_when_acting(tmp_path):
    """PPO refuses a transition without its log-prob and value: an update proves they came
    back from the store."""
    service = _service(tmp_path, PPOAgent(), {"log_every": 0, "train": {"n_steps": 32}})
    n = 4
    with MANAGERS["base"](make_env_fns("CartPole-v1", None, n)) as manager:
        manager.launch(seed=0)
        service.episodeStarted(
            {"obs": {f"p:{i}": o.tolist() for i, o in manager.ready_obs.items()}}
        )
        stepper = ColumnStepper(InProcessClient(service))
        outcomes = {}
        for _ in range(10):
            actions = stepper.step(manager.ready_obs, outcomes)
            outcomes = {
                i: StepOutcome(t.obs, t.reward, t.terminated, t.truncated)
                for i, t in manager.step({i: int(a) for i, a in actions.items()}).items()
            }
    assert service.agent.learner.train_iter == 1 and service.agent.learner.env_steps == 36


def _train(service: AgentService, stepper, steps: int, n: int = 2) -> None:
    with MANAGERS["base"](make_env_fns("CartPole-v1", None, n)) as manager:
        manager.launch(seed=0)
        service.episodeStarted(
            {"obs": {f"p:{i}": o.tolist() for i, o in manager.ready_obs.items()}}
        )
        outcomes = {}
        for _ in range(steps):
            actions = stepper.step(manager.ready_obs, outcomes)
            outcomes = {
                i: StepOutcome(t.obs, t.reward, t.terminated, t.truncated)
                for i, t in manager.step({i: int(a) for i, a in actions.items()}).items()
            }
        stepper.step({}, outcomes)
        service.episodeStopped()


# a DQN and a PPO agent that update within `_train`'s 150 steps of two copies
LEARNERS = pytest.mark.parametrize(
    "agent_cls, hparams",
    [
        (
            DQNAgent,
            {
                "log_every": 0,
                "train": {"learning_starts": 40, "train_freq": 10, "gradient_steps": 5},
                "policy": {"model": {"hidden_sizes": [32]}},
            },
        ),
        (
            PPOAgent,
            {
                "log_every": 0,
                "train": {"n_steps": 64},
                "policy": {"learn": {"epochs": 2, "batch_size": 32}},
            },
        ),
    ],
)


def _same_training(a, b) -> None:
    """Two agents trained by `_train` alike: the same counters and weights, bit for bit."""
    assert a.learner.env_steps == b.learner.env_steps == 300
    assert a.learner.train_iter == b.learner.train_iter > 0
    for x, y in zip(a.policy.model.parameters(), b.policy.model.parameters()):
        assert torch.equal(x, y)


@LEARNERS
def test_columns_and_the_entity_form_train_an_agent_alike(tmp_path, agent_cls, hparams):
    """One pipeline: the same seeded agent driven by stepColumns and by the entity-keyed
    step ends with the same weights and counters."""
    by_columns = _service(tmp_path / "c", agent_cls(), hparams)
    by_entities = _service(tmp_path / "e", agent_cls(), hparams)
    _train(by_columns, ColumnStepper(InProcessClient(by_columns)), 150)
    _train(
        by_entities, EntityStepper(InProcessClient(by_entities), frozenset({"step"}), "p", 2), 150
    )
    a, b = by_columns.agent, by_entities.agent
    _same_training(a, b)


class SettlingClient(InProcessClient):
    """The in-process client in the served order: a step's learning waits until after its
    answer (`Lifecycle.defer`), then runs right away as the pipeline runs it after sending
    (`eager`), or only when the next operation comes (every operation settles first)."""

    def __init__(self, service: AgentService, eager: bool) -> None:
        super().__init__(service)
        service.lifecycle.after_answers = True
        self.eager = eager

    def _call(self, *args, **kwargs):
        answer = super()._call(*args, **kwargs)
        if self.eager:
            self.service.lifecycle.settle()
        return answer


@pytest.mark.parametrize("eager", [True, False])
@LEARNERS
def test_learning_after_the_answers_trains_an_agent_as_learning_inside_the_steps(
    tmp_path, agent_cls, hparams, eager
):
    """A seeded run repeats itself whether a step's learning runs inside it (a service
    object called directly) or after its answer (served): the same weights and counters."""
    inside = _service(tmp_path / "i", agent_cls(), hparams)
    after = _service(tmp_path / "a", agent_cls(), hparams)
    _train(inside, ColumnStepper(InProcessClient(inside)), 150)
    _train(after, ColumnStepper(SettlingClient(after, eager)), 150)
    a, b = inside.agent, after.agent
    _same_training(a, b)


def test_a_dqn_step_stores_after_its_answer_unless_updates_fall_due_at_it(tmp_path):
    """What acting reads (the env-step count: epsilon, the warm-up) is counted before the
    step acts, and the transitions reach the replay once the answer is out; but at a step
    where updates fall due, they run before it acts, as they always did."""
    service = _service(
        tmp_path,
        DQNAgent(),
        {
            "log_every": 0,
            "train": {"learning_starts": 4, "train_freq": 4, "gradient_steps": 1},
            "policy": {"learn": {"batch_size": 2}},
        },
    )
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    client = SettlingClient(service, eager=False)
    agent = service.agent

    def step(value: float, ids=None):
        outcomes = (
            {}
            if ids is None
            else {"step_ids": ids, "rewards": np.ones(2), "terminated": np.zeros(2, bool)}
        )
        return client.step_columns(np.arange(2), _obs(2, value), **outcomes).step_ids

    ids = step(1, step(0))
    assert agent.learner.env_steps == 2 and agent.trainer.buffer.count() == 0
    service.lifecycle.settle()
    assert agent.learner.env_steps == 2 and agent.trainer.buffer.count() == 2
    step(2, ids)  # env step 4: the first update is due
    assert agent.trainer.buffer.count() == 4 and agent.learner.train_iter == 1


def test_an_eval_episode_keeps_nothing_and_leaves_steps_in_flight_alone(tmp_path):
    """A resumed training run reports steps it took before an evaluation: the evaluation's
    steps (never reported) must not push them out of the bounded store."""
    service = _service(tmp_path, RecordingAgent())
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    client = InProcessClient(service)
    in_flight = client.step_columns(np.arange(2), _obs(2, 0)).step_ids
    service.episodeStopped()
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}, "mode": "eval"})
    for _ in range(service.steps.max_batches + 10):
        assert client.step_columns(np.arange(2), _obs(2, 1)).step_ids.tolist() == [-1, -1]
    service.episodeStopped()
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    client.step_columns(
        np.arange(2),
        _obs(2, 2),
        step_ids=in_flight,
        rewards=np.ones(2),
        terminated=np.zeros(2, bool),
    )
    assert service.agent.learned[-1].obs[:, 0].tolist() == [0, 0]


def test_the_column_stepper_sends_each_observation_once_with_masks_for_resets(tmp_path):
    service = _service(tmp_path, RecordingAgent())
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    stepper = ColumnStepper(InProcessClient(service))
    mask = np.array([1, 0], bool)
    first = stepper.step({0: _obs(1, 1)[0], 1: _obs(1, 1)[0]}, {}, {0: mask, 1: mask})
    assert stepper.in_flight() == {0, 1} and set(first) == {0, 1}
    outcomes = {
        0: StepOutcome(_obs(1, 2)[0], 1.0, False, False, mask),
        1: StepOutcome(_obs(1, 3)[0], 1.0, True, False, np.zeros(2, bool)),
    }
    second = stepper.step({0: _obs(1, 2)[0], 1: _obs(1, 7)[0]}, outcomes, {0: mask, 1: mask})
    assert second == {0: 0, 1: 0}  # the masks allow action 0 only
    (learned,) = service.agent.learned
    assert learned.next_obs[:, 0].tolist() == [2, 3]
    assert learned.next_action_mask.tolist() == [[True, False], [False, False]]
    kept = service.steps.lookup(np.array(sorted(stepper.step_ids.values())))
    assert kept.obs[:, 0].tolist() == [2, 7]  # copy 1 acts on its reset observation


# ---- pipelined (depth 2) ----------------------------------------------------------------------
def _drive_recording(stepper, n: int, steps: int, seed: int = 0) -> tuple[list[dict], dict]:
    """Drive CartPole copies through `stepper` as the gym orchestrator's loop does; returns
    what each call answered (env -> action) and every env step taken per copy (obs acted on,
    action, next obs)."""
    calls, taken = [], {i: [] for i in range(n)}
    with MANAGERS["base"](make_env_fns("CartPole-v1", None, n)) as manager:
        manager.launch(seed=seed)
        outcomes = {}
        for _ in range(steps):
            ready = manager.ready_obs
            actions = stepper.step(ready, outcomes)
            calls.append(actions)
            outcomes = {}
            for i, t in manager.step({i: int(a) for i, a in actions.items()}).items():
                outcomes[i] = StepOutcome(t.obs, t.reward, t.terminated, t.truncated)
                taken[i].append((ready[i][0], int(actions[i]), t.obs[0]))
        stepper.step({}, outcomes)
    return calls, taken


def test_a_pipelined_stepper_steps_halves_in_turn_and_every_step_reaches_the_agent_once(tmp_path):
    service = _service(tmp_path, RecordingAgent())
    service.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    stepper = ColumnStepper(InProcessClient(service), depth=2)
    calls, taken = _drive_recording(stepper, 4, 40)
    assert [sorted(c) for c in calls[:4]] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    learned = {i: [] for i in range(4)}
    for batch in service.agent.learned:
        for env, obs, action, next_obs in zip(
            batch.envs.tolist(), batch.obs[:, 0], batch.actions.tolist(), batch.next_obs[:, 0]
        ):
            learned[env].append((obs, action, next_obs))
    # each copy's steps, in order, exactly once, as the env took them
    assert learned == {
        i: [(np.float32(a), b, np.float32(c)) for a, b, c in steps] for i, steps in taken.items()
    }
    assert sum(map(len, learned.values())) == 40 * 2
    # the loop's end read the last answer: those actions wait for a next call
    assert set(stepper._held) == {0, 1} and stepper._pipeline.answers == deque()
    assert stepper.step({i: _obs(1, 5)[0] for i in range(4)}, {}).keys() == {0, 1}


def test_pipelined_requests_over_http_train_the_agent_as_in_process(launch, tmp_path):
    """The service runs one connection's pipelined requests in the order sent: a seeded
    DQN agent served over HTTP acts and learns exactly as the same agent driven in process
    (requests run as they are sent)."""
    hparams = {
        "log_every": 0,
        "train": {"learning_starts": 40, "train_freq": 10, "gradient_steps": 5},
        "policy": {"model": {"hidden_sizes": [32]}},
    }
    in_process = _service(tmp_path, DQNAgent(), hparams)
    in_process.episodeStarted({"obs": {"p": [0, 0, 0, 0]}})
    local_calls, _ = _drive_recording(ColumnStepper(InProcessClient(in_process), depth=2), 4, 60)
    agent = launch("agent", "agents.dqn_agent:DQNAgent").client()
    agent.initialize(hyperparameters={"seed": 0, **hparams})
    agent.build_model()
    agent.agent_registered({"name": "p", **SPACES})
    agent.episode_started({"p": [0, 0, 0, 0]})
    agent.binary = True
    stepper = ColumnStepper(agent, depth=2)
    served_calls, _ = _drive_recording(stepper, 4, 60)
    assert stepper._pipeline.pending == 0
    assert [{i: int(a) for i, a in c.items()} for c in served_calls] == [
        {i: int(a) for i, a in c.items()} for c in local_calls
    ]
    assert in_process.agent.learner.train_iter > 0
    served = agent.get_policy(weights=True)
    local = InProcessClient(in_process).get_policy(weights=True)
    assert served.env_steps == local.env_steps == 60 * 2
    assert served.weights.keys() == local.weights.keys()
    for name in local.weights:
        np.testing.assert_array_equal(served.weights[name], local.weights[name])


# ---- the wire -------------------------------------------------------------------------------
def _forms(data: bytes) -> dict[str, int]:
    return {column.path: column.form for column in codec.describe(data)[0]}


@pytest.mark.parametrize("shape", [(1,), (16,), (17,), (64,), (5, 7), (0,)])
def test_bool_columns_of_more_than_16_values_travel_as_bits(shape):
    rng = np.random.default_rng(0)
    flags = rng.random(shape) > 0.5
    flags.flat[:2] = [True, False]  # (not all the same: that is a fill)
    x = np.array([1.5, 2.5], np.float32)
    data = codec.encode({"flags": flags, "x": x}, columns=True)
    packed = flags.size > codec.PACK_FROM
    assert _forms(data)["flags"] == (codec.BITS if packed else codec.BYTES)
    assert data.endswith(x.tobytes())
    after_header = (-(-flags.size // 8) if packed else flags.size) + x.nbytes
    assert data[-after_header : -x.nbytes] == (
        np.packbits(flags).tobytes() if packed else flags.tobytes()
    )
    back = codec.decode(data)
    assert back["flags"].dtype == bool and back["flags"].shape == shape
    np.testing.assert_array_equal(back["flags"], flags)


def test_columns_round_trip_with_counting_vectors_as_ranges_and_equal_values_as_fills():
    body = {
        "envs": np.arange(5),
        "stepIds": np.arange(100, 105),
        "obs": np.arange(20, dtype=np.float32).reshape(5, 4),
        "rewards": np.ones(5, np.float32),
        "act": np.array([1, 0, 1, 1, 1], bool),
        "zeros": np.array([0.0, -0.0]),
        "nan": np.full(3, np.nan, np.float32),
        "down": np.arange(-3, -6, -1, dtype=np.int8),
        "big": np.arange(2**63, 2**63 + 2, dtype=np.uint64),
        "reset": {"rows": np.array([3]), "obs": _obs(1, 2)},
    }
    data = codec.encode(body, columns=True)
    columns, values = codec.describe(data)
    assert values == {}
    forms = {c.path: c.form for c in columns}
    assert forms == {
        "envs": codec.RANGE,
        "stepIds": codec.RANGE,
        "obs": codec.BYTES,
        "rewards": codec.FILL,
        "act": codec.BYTES,
        "zeros": codec.BYTES,
        "nan": codec.FILL,
        "down": codec.BYTES,
        "big": codec.RANGE,
        "reset.rows": codec.BYTES,
        "reset.obs": codec.FILL,
    }
    assert {c.path: c.first for c in columns if c.form == codec.RANGE} == {
        "envs": 0,
        "stepIds": 100,
        "big": 2**63,
    }
    back = codec.decode(data)
    for key, value in body.items():
        if key != "reset":
            assert back[key].dtype == value.dtype and back[key].shape == value.shape
            assert back[key].tobytes() == value.tobytes(), key  # (bit for bit: -0.0, NaN)
    np.testing.assert_array_equal(back["reset"]["obs"], body["reset"]["obs"])
    # only the arrays sent as bytes follow the header: obs, act, zeros, down, reset.rows
    assert sum(c.wire_bytes for c in columns) == 80 + 5 + 16 + 3 + 8
    assert data.endswith(
        body["obs"].tobytes()
        + body["act"].tobytes()
        + body["zeros"].tobytes()
        + body["down"].tobytes()
        + body["reset"]["rows"].tobytes()
    )


def test_a_column_step_is_mostly_its_arrays():
    """64 CartPole copies: 1,296 bytes of observations, rewards and flags as bits, and a
    header of a few bytes per array (a JSON header took 473)."""
    rng = np.random.default_rng(0)
    body = {
        "envs": np.arange(64),
        "obs": rng.random((64, 4), np.float32),
        "stepIds": np.arange(1088, 1152),
        "rewards": rng.random(64, np.float32),
        "terminated": np.arange(64) % 9 == 0,
        "truncated": np.arange(64) % 7 == 0,
    }
    data = codec.encode(body, columns=True)
    assert len(data) - (64 * 16 + 64 * 4 + 8 + 8) < 100


def _columns_message(*arrays: bytes, values: bytes = b"", tail: bytes = b"") -> bytes:
    return (
        codec.COLUMNS_MAGIC
        + codec._varint(len(arrays))
        + b"".join(arrays)
        + codec._varint(len(values))
        + values
        + tail
    )


def _spec(path: bytes, dtype: str, form: int, shape: tuple, extra: bytes = b"") -> bytes:
    return (
        codec._varint(len(path))
        + path
        + bytes((codec.DTYPES.index(dtype), form))
        + codec._varint(len(shape))
        + b"".join(codec._varint(n) for n in shape)
        + extra
    )


F4, B1, I8 = "<f4", "|b1", "<i8"


@pytest.mark.parametrize(
    "data",
    [
        codec.COLUMNS_MAGIC,  # no count
        _columns_message(_spec(b"a", F4, codec.RANGE, (3,), b"\x00")),  # a float range
        _columns_message(_spec(b"a", I8, codec.RANGE, (2, 2), b"\x00")),  # a range of 2 axes
        _columns_message(_spec(b"a", "|i1", codec.RANGE, (3,), codec._varint(2 * 126))),  # past i1
        _columns_message(_spec(b"a.b.c.d", I8, codec.RANGE, (1,), b"\x00")),  # too deep
        _columns_message(_spec(b"a", F4, codec.BYTES, (4,))),  # past the body
        _columns_message(_spec(b"a", F4, codec.BYTES, (1,)), tail=bytes(5)),  # a byte left over
        _columns_message(_spec(b"a", F4, codec.BITS, (1,)), tail=bytes(1)),  # bits of floats
        _columns_message(_spec(b"a", B1, codec.BITS, (9,)), tail=bytes(1)),  # 9 bits in 1 byte
        _columns_message(_spec(b"a", F4, 4, (1,)), tail=bytes(4)),  # no such form
        _columns_message(bytes((1,)) + b"a" + bytes((12, 0, 1, 1)), tail=bytes(1)),  # no dtype 12
        _columns_message(_spec(b"a", F4, codec.BYTES, ())),  # no axes
        _columns_message(_spec(b"a", F4, codec.FILL, (1 << 25,), bytes(4))),  # fills too much
        _columns_message(_spec(b"a", F4, codec.FILL, (2,), bytes(2))),  # a value cut short
        _columns_message(
            _spec(b"a", F4, codec.BYTES, (1,)), _spec(b"a", F4, codec.BYTES, (1,)), tail=bytes(8)
        ),  # given twice
        _columns_message(values=b"[1]"),  # values not an object
        _columns_message(values=b"{"),  # not JSON
        codec.COLUMNS_MAGIC + b"\xff" * 11,  # a varint without end
        codec.COLUMNS_MAGIC + b"\x01\x05ab",  # a path cut short
        codec.COLUMNS_MAGIC + b"\x01\x02\xff\xfe" + bytes((10, 0, 1, 1)) + b"\x00" + bytes(4),
    ],
)
def test_malformed_columns_are_invalid_requests(data):
    with pytest.raises(InvalidRequest, match="malformed"):
        codec.decode(data)


def test_the_earlier_json_header_of_columns_is_refused_naming_the_new_form():
    import json

    header = json.dumps(
        {"arrays": {"x": {"dtype": "<f4", "shape": [1], "offset": 0}}, "values": {}}
    ).encode()
    with pytest.raises(InvalidRequest, match="column form before 2026-11-27"):
        codec.decode(len(header).to_bytes(4, "little") + header + bytes(4))


def test_a_column_needs_an_axis_and_a_numeric_dtype():
    for bad in (np.float32(1.0), np.array(1.0), np.array(["a", "b"])):
        body = {"x": np.asarray(bad)}
        with pytest.raises(ValueError):
            codec.encode(body, columns=True)
    big_endian = np.arange(3, dtype=">f4") * 1.5
    back = codec.decode(codec.encode({"x": big_endian}, columns=True))["x"]
    assert back.dtype == np.dtype("<f4") and back.tolist() == big_endian.tolist()


@pytest.mark.parametrize("binary", [False, True])
def test_step_columns_over_http(launch, binary):
    service = launch("agent", RANDOM_AGENT)
    agent = service.client()
    assert "columns" in agent.api_version().capabilities
    agent.initialize(hyperparameters={"seed": 1})
    agent.build_model()
    agent.agent_registered({"name": "p", **SPACES})
    agent.episode_started({"p": [0, 0, 0, 0]})
    agent.binary = binary
    first = agent.step_columns(np.arange(8), _obs(8, 0))
    assert len(first) == 8 and first.actions.dtype.kind in "iu"
    assert set(first.actions.tolist()) <= {0, 1}
    second = agent.step_columns(
        np.arange(8),
        _obs(8, 0),
        step_ids=first.step_ids,
        rewards=np.ones(8),
        terminated=np.zeros(8, bool),
        truncated=np.zeros(8, bool),
    )
    assert second.step_ids[0] == first.step_ids[-1] + 1
    with pytest.raises(Exception, match="is not one this agent is waiting on"):
        agent.step_columns(
            np.arange(8),
            _obs(8, 0),
            step_ids=first.step_ids,
            rewards=np.ones(8),
            terminated=np.zeros(8, bool),
        )
    assert agent.status().state == "in_episode"
