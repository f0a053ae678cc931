"""The one place that runs a lifecycle trigger.

`Lifecycle` wraps a `transitions.Machine` built from a `Table` and adds what a service needs
around it: a lock so that a call either fires its trigger or is refused with 409 (never silently
dropped), a `resourceVersion` that moves on every change so callers can long-poll instead of
sleeping, tasks that run hooks in the caller's thread or in the background, cancellation for
the operations that preempt (reset, terminate, stopEpisode), and the failure rule: an exception
in a hook moves the service to ``failed`` with the reason in status.

Work after the answer (`defer`, `settle`): a hook may leave part of its work to run once its
answer is out (an agent's step learns from the transitions while the orchestrator steps its
envs). The work runs, in this order, before anything else: at `settle`, which the service's
pipeline calls right after sending the answer, or at the start of the next operation,
whichever comes first. So every operation still sees what all operations before it did, and a
seeded run does the same work in the same order. An exception there fails the service as a
hook's would (the answer has gone: the caller learns it from the next call and the status).
A service object called without a pipeline (`after_answers` False) runs the work at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
import uuid
from typing import Any, Callable, Mapping, TypeVar

from transitions import Machine

from mistk_rl.errors import HookFailed, IllegalState, Rejected
from mistk_rl.lifecycle.tables import Table

log = logging.getLogger(__name__)
T = TypeVar("T")
Facts = Mapping[str, bool] | Callable[[], Mapping[str, bool]] | None


class Task:
    """One accepted operation: the hook it runs, and how to cancel it.

    Its two events are made only when someone asks for them: most tasks are steps that
    nothing cancels or waits on, and two `threading.Event`s cost more than the rest of a
    step's bookkeeping (~5 us of the ~110 us a getAction takes in the server)."""

    __slots__ = ("id", "operation", "origin", "finished", "_cancel", "_done")

    def __init__(self, id: int, operation: str, origin: str) -> None:  # noqa: A002
        self.id, self.operation = id, operation
        self.origin = origin  # the state the operation was accepted in
        self.finished = False
        self._cancel: threading.Event | None = None
        self._done: threading.Event | None = None

    @property
    def cancel(self) -> threading.Event:
        """Set to ask the hook to stop (preemption)."""
        if self._cancel is None:
            with _TASK_EVENTS:
                if self._cancel is None:
                    self._cancel = threading.Event()
        return self._cancel

    @property
    def cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    def finish(self) -> None:
        """The hook returned or raised: wake whoever waits in `wait_done`."""
        with _TASK_EVENTS:
            self.finished = True
            done = self._done
        if done is not None:
            done.set()

    def wait_done(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the hook to end; False when it did not."""
        with _TASK_EVENTS:
            if self.finished:
                return True
            if self._done is None:
                self._done = threading.Event()
            done = self._done
        return done.wait(timeout)


_TASK_EVENTS = threading.Lock()  # makes a task's events once, and orders finish/wait_done


def api_name(trigger: str) -> str:
    """build_model -> buildModel: how the spec names the operation a trigger belongs to."""
    head, *rest = trigger.split("_")
    return head + "".join(word.capitalize() for word in rest)


class _Model:
    """The object `transitions` binds triggers to; kept apart from user code on purpose
    (a user method named like a trigger would be silently skipped by transitions 0.9)."""

    state: str
    trigger: Callable[..., bool]  # (bound by the Machine)


# A row with only these keys has no condition and no callback: firing its trigger can only
# set the state (and the machine's after_state_change, which `Lifecycle._fire` repeats).
PLAIN_ROW = frozenset({"trigger", "source", "dest"})


def direct_moves(table: Table) -> dict[tuple[str, str], str]:
    """(state, trigger) -> destination, where the machine would always take a plain row: the
    first row for that pair has no condition and no callback. The per-step operations (two
    triggers a step) move there directly instead of through transitions' event processing
    (150 -> 30 us a step under cProfile). Any other row, one with a condition or with a
    callback someone adds (``before``, ``after``, ``prepare``, ...), goes through the
    machine, so its callback runs; the states are names, with no callbacks of their own."""
    first: dict[tuple[str, str], dict] = {}
    for row in table.transitions:
        sources = [row["source"]] if isinstance(row["source"], str) else row["source"]
        for source in sources:
            first.setdefault((source, row["trigger"]), row)
    return {key: row["dest"] for key, row in first.items() if set(row) <= PLAIN_ROW}


class Lifecycle:
    """State, version, payload and tasks of one service, driven by a transition table."""

    def __init__(self, table: Table, *, preempt_grace_s: float = 5.0) -> None:
        self.table = table
        self.preempt_grace_s = preempt_grace_s
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._model = _Model()
        self._machine = Machine(
            model=self._model,
            states=list(table.states),
            transitions=[dict(t) for t in table.transitions],
            initial=table.initial,
            auto_transitions=False,
            send_event=True,
            after_state_change=self._on_change,
        )
        # the public operations legal in each state, computed once: this is asked on every
        # call (the per-step ones included), and only the internal `finish` has conditions
        self._allowed = {
            state: [name for name in table.operations if name in self._machine.get_triggers(state)]
            for state in table.states
        }
        self._direct = direct_moves(table)
        self._ids = itertools.count(1)
        self._task: Task | None = None
        self._local = threading.local()
        self._watchers: set[Callable[[], None]] = set()  # async long-polls waiting
        # names this process's state: a service that restarts (a new worker) starts over at
        # version 0 with a new instance, so a caller can never take it for the old one
        self.instance = uuid.uuid4().hex[:16]
        self.version = 0
        self._next_wake = 0.0  # update_payload's throttle
        self.payload: dict[str, Any] = {}
        self.reason: str | None = None
        # a pipeline settles after each answer (module doc); without one, `defer` runs at once
        self.after_answers = False
        self._deferred: tuple[str, Callable[[], None]] | None = None
        self._settling = threading.Lock()  # held while deferred work runs

    # ---- reading -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._model.state

    def allowed(self) -> list[str]:
        """The operations legal in the current state (trigger names)."""
        return list(self._allowed[self.state])

    def allowed_api(self) -> list[str]:
        """The same, named as the API names them (operationIds: buildModel, ...)."""
        return [api_name(name) for name in self.allowed()]

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "state": self.state,
                "resourceVersion": self.version,
                "payload": dict(self.payload),
                "reason": self.reason,
                "allowed": self.allowed_api(),
                "instance": self.instance,
            }

    async def wait_async(self, after_version: int, timeout: float) -> dict[str, Any]:
        """Wait until the version is past `after_version` or `timeout` seconds passed, on the
        event loop (holding no thread). A version ahead of this service's (the caller saw
        another instance) answers at once."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(changed.set)
            except RuntimeError:  # the loop is closing: nobody is waiting any more
                pass

        with self._lock:
            if after_version > self.version:
                return self.status()
            self._watchers.add(wake)
        try:
            deadline = loop.time() + max(0.0, timeout)
            while self.version <= after_version:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                changed.clear()
                if self.version > after_version:
                    break
                try:
                    await asyncio.wait_for(changed.wait(), remaining)
                except asyncio.TimeoutError:
                    break
        finally:
            with self._lock:
                self._watchers.discard(wake)
        return self.status()

    def wait_for_state(self, states: set[str] | str, timeout: float) -> dict[str, Any]:
        """In-process counterpart of the SDK's wait_for_state (for tests and embedding)."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.state not in wanted:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"state is {self.state!r}, not {sorted(wanted)} after {timeout} s"
                    )
                self._changed.wait(remaining)
            return self.status()

    # ---- progress and cancellation for hooks ----------------------------------------------
    def update_payload(self, payload: Mapping[str, Any], every_s: float = 0.0) -> None:
        """Merge progress into the status payload and wake long-polls, at most once every
        `every_s` seconds: status always shows the latest values, but progress reported per
        env step must not cost every long-polling caller a round trip per step."""
        with self._lock:
            self.payload.update(payload)
            now = time.monotonic()
            if every_s <= 0 or now >= self._next_wake:
                self._next_wake = now + every_s if every_s > 0 else self._next_wake
                self._bump()

    @property
    def cancel_requested(self) -> bool:
        """True inside a hook whose task was cancelled (by reset, terminate or stopEpisode)."""
        task: Task | None = getattr(self._local, "task", None)
        return task is not None and task.cancelled

    def current_cancel_event(self) -> threading.Event | None:
        """The cancel event of the task running in this thread (for waits that should wake)."""
        task: Task | None = getattr(self._local, "task", None)
        return task.cancel if task is not None else None

    # ---- running operations --------------------------------------------------------------
    def check(self, operation: str) -> None:
        """Raise IllegalState if `operation` is not legal now; changes nothing. For a handler
        that must do slow or remote checks before `run` (which checks again, atomically)."""
        with self._lock:
            if operation not in self._allowed[self.state]:
                raise IllegalState(
                    api_name(operation),
                    self.state,
                    self.allowed_api(),
                    busy=self.state in self.table.busy_states,
                )

    def run(self, operation: str, hook: Callable[[], T], *, facts: Facts = None) -> T | dict:
        """Fire `operation`'s trigger, run `hook`, then fire ``finish`` (or ``fail``).

        Raises IllegalState (nothing changed) when the operation is not legal now. A foreground
        operation returns the hook's result; a background one returns the status at once.
        """
        op = self.table.operations[operation]
        self.settle()
        with self._lock:
            if operation == "terminate" and self.state in ("terminating", "terminated"):
                return self.status()  # terminate is idempotent
            if operation not in self._allowed[self.state]:
                raise IllegalState(
                    api_name(operation),
                    self.state,
                    self.allowed_api(),
                    busy=self.state in self.table.busy_states,
                )
            previous = self._task
            task = Task(next(self._ids), operation, origin=self.state)
            self._task = task
            self._fire(operation)
            # a 202 answer shows the busy state (callers wait until it changes); foreground
            # operations, the per-step ones among them, need no snapshot
            accepted = self.status() if op.background else None
        if op.preempts and previous is not None and not previous.finished:
            previous.cancel.set()
            if not previous.wait_done(self.preempt_grace_s):
                log.warning(
                    "%s: %s did not stop within %.1f s of being cancelled; going on",
                    self.table.role,
                    previous.operation,
                    self.preempt_grace_s,
                )
        if op.background:
            # (in the caller's context: its trace goes on in the calls the hook makes)
            context = contextvars.copy_context()
            threading.Thread(
                target=context.run,
                args=(self._execute, task, hook, facts, True),
                daemon=True,
                name=f"{self.table.role}-{operation}-{task.id}",
            ).start()
            assert accepted is not None  # (the snapshot taken under the lock)
            return accepted
        return self._execute(task, hook, facts, False)

    def _execute(self, task: Task, hook: Callable[[], T], facts: Facts, background: bool) -> Any:
        self._local.task = task
        try:
            result = hook()
        except Rejected:
            with self._lock:
                if self._task is task:  # the request is refused after all: undo the trigger
                    self._task = None
                    self._machine.set_state(task.origin)
                    self._bump()
            if background:
                return None
            raise
        except Exception as exc:
            reason = f"{api_name(task.operation)} raised {type(exc).__name__}: {exc}"
            log.exception("%s: %s", self.table.role, reason)
            with self._lock:
                if self._task is task:
                    self.reason = reason
                    # a failing do_terminate still ends terminated: resources are gone anyway
                    self._fire("finish" if self.state == "terminating" else "fail")
            if background:
                return None
            raise HookFailed(
                f"{reason}; the service is now '{self.state}'", state=self.state
            ) from exc
        finally:
            task.finish()
            self._local.task = None
        with self._lock:
            if self._task is task:
                kwargs = dict(facts() if callable(facts) else (facts or {}))
                if task.operation == "reset":
                    self.reason = None
                    self.payload = {}
                self._fire("finish", **kwargs)
        return result

    # ---- work after the answer (module doc) -----------------------------------------------
    def defer(self, work: Callable[[], None]) -> None:
        """From inside a hook: run `work` once this operation's answer is out (`settle`);
        at once when no pipeline settles (`after_answers` False), as part of the hook."""
        if not self.after_answers:
            work()
            return
        task: Task | None = getattr(self._local, "task", None)
        operation = task.operation if task is not None else "operation"
        with self._settling:
            if self._deferred is not None:  # (never: every operation settles first)
                raise RuntimeError("defer: the last operation's deferred work has not run")
            self._deferred = (operation, work)

    def settle(self) -> None:
        """Run the deferred work, if any (a caller in another thread waits for it)."""
        if self._deferred is None and not self._settling.locked():  # (the common case:
            return  # nothing deferred, nothing running; read without taking the lock)
        with self._settling:
            if self._deferred is None:
                return
            (operation, work), self._deferred = self._deferred, None
            try:
                work()
            except Exception as exc:
                reason = (
                    f"{api_name(operation)} raised {type(exc).__name__} after its answer: {exc}"
                )
                log.exception("%s: %s", self.table.role, reason)
                with self._lock:
                    if self.state not in ("failed", "terminating", "terminated"):
                        self.reason = reason
                        self._fire("fail")

    def _fire(self, trigger: str, **facts: bool) -> None:
        """Move as `trigger` says from the current state (the caller holds the lock)."""
        dest = self._direct.get((self.state, trigger))
        if dest is None:  # a row with a condition on `facts`: the machine decides
            self._model.trigger(trigger, **facts)
            return
        self._model.state = dest  # what the machine's set_state does, less its look-ups
        self._bump()  # what the machine's after_state_change does

    def _on_change(self, _event: Any = None) -> None:
        self._bump()

    def _bump(self) -> None:
        with self._changed:
            self.version += 1
            self._changed.notify_all()
            for wake in self._watchers:
                wake()
