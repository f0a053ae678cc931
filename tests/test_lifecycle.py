"""Both lifecycles, exhaustively in-process: every (state, operation) pair.

The expected tables below are written out from the MISTK gaming guide (with our fixes), not
derived from `mistk_rl.lifecycle.tables`, so a wrong row in the implementation fails here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import types

import pytest
from transitions import Machine

from mistk_rl.errors import HookFailed, IllegalState, Rejected
from mistk_rl.lifecycle import AGENT, ORCHESTRATOR, Lifecycle
from mistk_rl.lifecycle.machine import Task, direct_moves

# operation -> {legal source state: state after the hook returns}
AGENT_EXPECTED = {
    "initialize": {"started": "initialized"},
    "build_model": {"initialized": "initialized", "ready": "ready"},
    "save_model": {"initialized": "initialized", "ready": "ready"},
    "agent_registered": {"initialized": "ready", "ready": "ready"},
    "episode_started": {"ready": "in_episode"},
    "get_action": {"in_episode": "in_episode"},
    "replay_action": {"in_episode": "in_episode"},
    "step": {"in_episode": "in_episode"},
    "episode_stopped": {"in_episode": "ready"},
}
ORCHESTRATOR_EXPECTED = {
    "initialize": {"uninitialized": "waiting_for_agents"},
    "register_agent": {"waiting_for_agents": "waiting_for_agents"},  # until all are in
    "start_episode": {"ready": "completed_episode"},
    "save_episode": {"completed_episode": "completed_episode"},
    "stop_episode": {"running": "ready", "completed_episode": "ready"},
}
RESET_TARGET = {"agent": "started", "orchestrator": "uninitialized"}
CASES = [(AGENT, AGENT_EXPECTED), (ORCHESTRATOR, ORCHESTRATOR_EXPECTED)]


def _at(table, state: str) -> Lifecycle:
    lifecycle = Lifecycle(table, preempt_grace_s=1.0)
    lifecycle._machine.set_state(state)
    return lifecycle


def _pairs():
    for table, expected in CASES:
        for state in table.states:
            for operation in table.operations:
                yield pytest.param(
                    table, expected, state, operation, id=f"{table.role}-{state}-{operation}"
                )


@pytest.mark.parametrize("table, expected, state, operation", list(_pairs()))
def test_every_state_operation_pair(table, expected, state, operation):
    lifecycle = _at(table, state)
    before = lifecycle.version
    if operation == "terminate":
        lifecycle.run("terminate", lambda: None)
        # terminate is legal everywhere; while one is already in flight it changes nothing
        assert lifecycle.state == ("terminating" if state == "terminating" else "terminated")
        return
    if operation == "reset":
        legal = state not in ("terminating", "terminated")
        target = RESET_TARGET[table.role]
    else:
        legal = state in expected[operation]
        target = expected[operation].get(state)
    if not legal:
        with pytest.raises(IllegalState) as info:
            lifecycle.run(operation, lambda: None)
        assert info.value.state == state
        assert lifecycle.state == state and lifecycle.version == before
        return
    lifecycle.run(operation, lambda: None)
    final = lifecycle.wait_for_state(target, timeout=5)
    assert final["state"] == target
    assert lifecycle.version > before


def test_every_state_has_a_way_out():
    """Reset or terminate is legal everywhere except the end states (no MISTK dead ends)."""
    for table, _ in CASES:
        for state in table.states:
            allowed = _at(table, state).allowed()
            if state not in ("terminating", "terminated"):
                assert {"reset", "terminate"} <= set(allowed), (table.role, state)


def test_busy_states_refuse_everything_but_the_preempting_operations():
    for table, _ in CASES:
        for state in table.busy_states - {"terminating"}:
            extra = {"stop_episode"} if state == "running" else set()
            assert set(_at(table, state).allowed()) == {"reset", "terminate"} | extra, state


def test_registration_reaches_ready_when_all_agents_are_in():
    lifecycle = _at(ORCHESTRATOR, "waiting_for_agents")
    lifecycle.run("register_agent", lambda: None, facts={"all_agents_registered": True})
    assert lifecycle.state == "ready"


def test_agent_reset_keeps_model_only_when_asked():
    lifecycle = _at(AGENT, "in_episode")
    lifecycle.run("reset", lambda: None, facts={"keep_model": True})
    assert lifecycle.wait_for_state("initialized", 5)["state"] == "initialized"


def test_hook_exception_fails_with_reason_and_only_reset_leaves():
    lifecycle = _at(AGENT, "in_episode")

    def boom():
        raise ValueError("bad observation shape")

    with pytest.raises(HookFailed, match="bad observation shape"):
        lifecycle.run("get_action", boom)
    status = lifecycle.status()
    assert status["state"] == "failed"
    assert "ValueError: bad observation shape" in status["reason"]
    assert set(lifecycle.allowed()) == {"reset", "terminate"}
    with pytest.raises(IllegalState):
        lifecycle.run("get_action", lambda: None)
    lifecycle.run("reset", lambda: None)
    status = lifecycle.wait_for_state("started", 5)
    assert status["reason"] is None


def test_background_hook_exception_fails():
    lifecycle = _at(AGENT, "initialized")

    def boom():
        raise RuntimeError("checkpoint is corrupt")

    accepted = lifecycle.run("build_model", boom)
    assert accepted["state"] == "building_model"  # the 202 body shows the busy state
    status = lifecycle.wait_for_state("failed", 5)
    assert "checkpoint is corrupt" in status["reason"]


def test_deferred_work_runs_at_once_when_no_pipeline_settles():
    lifecycle = _at(AGENT, "in_episode")
    done = []
    lifecycle.run(
        "step", lambda: (lifecycle.defer(lambda: done.append("learned")), done.append("answered"))
    )
    assert done == ["learned", "answered"]  # inside the hook, as if it were not deferred


def test_deferred_work_runs_at_settle_or_before_the_next_operation_once():
    lifecycle = _at(AGENT, "in_episode")
    lifecycle.after_answers = True
    done = []

    def step(n: int):
        def hook():
            lifecycle.defer(lambda: done.append(f"learned {n}"))
            done.append(f"answered {n}")

        return hook

    lifecycle.run("step", step(1))
    assert done == ["answered 1"]
    lifecycle.settle()
    lifecycle.settle()
    assert done == ["answered 1", "learned 1"]
    lifecycle.run("step", step(2))
    lifecycle.run("episode_stopped", lambda: done.append("stopped"))  # (not settled)
    assert done[2:] == ["answered 2", "learned 2", "stopped"]


def test_deferred_work_that_raises_fails_the_service_with_the_reason():
    lifecycle = _at(AGENT, "in_episode")
    lifecycle.after_answers = True

    def boom():
        raise ValueError("replay write failed")

    assert lifecycle.run("step", lambda: (lifecycle.defer(boom), "actions")[1]) == "actions"
    assert lifecycle.state == "in_episode"  # the answer went out as it was
    lifecycle.settle()
    status = lifecycle.status()
    assert status["state"] == "failed"
    assert "step raised ValueError after its answer: replay write failed" in status["reason"]
    with pytest.raises(IllegalState):
        lifecycle.run("step", lambda: None)


def test_an_operation_from_another_thread_waits_for_deferred_work_in_progress():
    lifecycle = _at(AGENT, "in_episode")
    lifecycle.after_answers = True
    started, release, done = threading.Event(), threading.Event(), []

    def slow_learning():
        started.set()
        assert release.wait(10)
        done.append("learned")

    lifecycle.run("step", lambda: lifecycle.defer(slow_learning))
    settling = threading.Thread(target=lifecycle.settle)
    settling.start()
    assert started.wait(10)
    stopping = threading.Thread(
        target=lambda: lifecycle.run("episode_stopped", lambda: done.append("stopped"))
    )
    stopping.start()
    stopping.join(0.2)  # (it cannot finish while the learning holds it; a bounded look)
    assert done == []
    release.set()
    settling.join(10)
    stopping.join(10)
    assert done == ["learned", "stopped"]


def test_rejected_hook_restores_the_state():
    lifecycle = _at(ORCHESTRATOR, "waiting_for_agents")

    def refuse():
        raise Rejected("agent is not initialized", status=409)

    with pytest.raises(Rejected):
        lifecycle.run("register_agent", refuse)
    assert lifecycle.state == "waiting_for_agents"


def test_busy_call_is_refused_not_dropped():
    lifecycle = _at(AGENT, "initialized")
    release = threading.Event()
    lifecycle.run("build_model", lambda: release.wait(10))
    with pytest.raises(IllegalState, match="busy"):
        lifecycle.run("save_model", lambda: None)
    release.set()
    assert lifecycle.wait_for_state("initialized", 5)["state"] == "initialized"


def test_stop_episode_cancels_running_work():
    lifecycle = _at(ORCHESTRATOR, "ready")
    seen_cancel = threading.Event()

    def episode_loop():
        while not lifecycle.cancel_requested:
            lifecycle.current_cancel_event().wait(0.05)
        seen_cancel.set()

    lifecycle.run("start_episode", episode_loop)
    assert lifecycle.state == "running"
    lifecycle.run("stop_episode", lambda: None)
    assert seen_cancel.is_set()  # the loop saw the cancel before stop finished
    assert lifecycle.state == "ready"


def test_terminate_preempts_and_late_completion_is_ignored():
    lifecycle = _at(AGENT, "initialized")
    release = threading.Event()
    lifecycle.run("build_model", lambda: release.wait(10))
    lifecycle.run("terminate", lambda: None)
    assert lifecycle.state == "terminated"
    release.set()  # the cancelled build finishing late must not move the state
    assert _wait(lifecycle, lifecycle.version, timeout=0.2)["state"] == "terminated"
    with pytest.raises(IllegalState):
        lifecycle.run("reset", lambda: None)


def test_a_task_wakes_its_waiter_whichever_comes_first():
    """A task's done event is made only when someone waits (most steps have no waiter):
    a wait that starts before, during or after the hook ends must see it end, never sleep
    out its timeout. 200 races of finish() against wait_done() on two threads."""
    done_already = Task(1, "step", "in_episode")
    done_already.finish()
    assert done_already.wait_done(0) and done_already._done is None  # no event was needed
    for i in range(200):
        task = Task(i, "build_model", "initialized")
        start = threading.Barrier(2)

        def finish(task=task, start=start) -> None:
            start.wait()
            task.finish()

        thread = threading.Thread(target=finish)
        thread.start()
        start.wait()
        assert task.wait_done(10), f"race {i}: the waiter missed the end of the hook"
        thread.join()
    untouched = Task(0, "step", "in_episode")
    assert not untouched.cancelled and untouched._cancel is None
    untouched.cancel.set()
    assert untouched.cancelled


def test_failing_terminate_still_terminates():
    lifecycle = _at(AGENT, "ready")

    def boom():
        raise OSError("disk gone")

    with pytest.raises(HookFailed):
        lifecycle.run("terminate", boom)
    assert lifecycle.state == "terminated"
    assert "disk gone" in lifecycle.status()["reason"]


def test_long_poll_returns_on_change_and_at_timeout():
    lifecycle = _at(AGENT, "ready")
    version = lifecycle.version
    unchanged = _wait(lifecycle, version, timeout=0.05)
    assert unchanged["resourceVersion"] == version
    timer = threading.Timer(0.05, lifecycle.update_payload, args=({"step": 1},))
    timer.start()
    changed = _wait(lifecycle, version, timeout=10)
    timer.join()
    assert changed["resourceVersion"] > version and changed["payload"] == {"step": 1}


def test_long_poll_for_a_version_never_seen_answers_at_once():
    lifecycle = _at(AGENT, "ready")
    ahead = _wait(lifecycle, lifecycle.version + 5, timeout=60)  # another instance's version
    assert ahead["resourceVersion"] == lifecycle.version and ahead["instance"]


def _wait(lifecycle, version: int, timeout: float) -> dict:
    return asyncio.run(lifecycle.wait_async(version, timeout))


def test_status_names_operations_as_the_api_does():
    status = _at(AGENT, "initialized").status()
    assert "buildModel" in status["allowed"] and "agentRegistered" in status["allowed"]


def test_per_step_progress_wakes_long_polls_at_most_once_a_period():
    lifecycle = _at(AGENT, "in_episode")
    version = lifecycle.version
    for step in range(100):
        lifecycle.update_payload({"step": step}, every_s=3600)
    assert lifecycle.version == version + 1  # the first woke them; the rest only updated
    assert lifecycle.status()["payload"]["step"] == 99
    lifecycle.update_payload({"done": True})  # an unthrottled update always wakes them
    assert lifecycle.version == version + 2


def test_docs_lifecycle_diagrams_are_current():
    """docs/lifecycle-tables.md is what the tables draw now (regenerate it with
    `python -m mistk_rl.lifecycle.diagram > docs/lifecycle-tables.md`), and every row of each
    table but the shared ones is an edge of its picture."""
    from pathlib import Path

    from mistk_rl.lifecycle.diagram import SHARED_TRIGGERS, document, mermaid

    doc = Path(__file__).resolve().parents[1] / "docs" / "lifecycle-tables.md"
    assert doc.read_text() == document()
    for table in (AGENT, ORCHESTRATOR):
        drawn = mermaid(table)
        for row in table.transitions:
            if row["trigger"] in SHARED_TRIGGERS:
                continue
            for source in [row["source"]] if isinstance(row["source"], str) else row["source"]:
                assert f"{source} --> {row['dest']}: {row['trigger']}" in drawn


@pytest.mark.parametrize("table", [AGENT, ORCHESTRATOR], ids=lambda t: t.role)
def test_the_direct_moves_go_where_the_machine_would(table):
    """`Lifecycle._fire` moves plain rows by hand: from every state, every trigger it moves
    that way lands where transitions' Machine, firing the same trigger, lands."""
    moves = direct_moves(table)
    assert len(moves) > len(table.states)  # (most rows are plain: the check has cases)
    for (state, trigger), dest in moves.items():
        model = types.SimpleNamespace()
        machine = Machine(
            model=model,
            states=list(table.states),
            initial=state,
            transitions=[dict(t) for t in table.transitions],
            auto_transitions=False,
        )
        assert machine.events[trigger].trigger(model), (state, trigger)
        assert model.state == dest, (state, trigger)


def test_a_row_with_a_callback_goes_through_the_machine():
    """A callback added to a row the fast path would move is run, not skipped: the row is no
    longer plain, so its trigger fires through the machine."""
    ran = []
    rows = [
        {**row, "after": lambda event: ran.append(event.transition.dest)}
        if row["trigger"] == "step"
        else row
        for row in AGENT.transitions
    ]
    table = dataclasses.replace(AGENT, transitions=tuple(rows))
    assert ("in_episode", "step") not in direct_moves(table)
    lifecycle = _at(table, "in_episode")
    lifecycle.run("step", lambda: None)
    assert ran == ["stepping"] and lifecycle.state == "in_episode"
