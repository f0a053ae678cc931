"""Pacing: the learning a trainer owes, paid a bounded amount per request or beside requests.

An agent service learns inside the requests that bring it transitions, and an orchestrator
waits for each request a bounded time (`--agent-timeout`, 20 s by default), which the agent
does not know. So a trainer's schedule does not run updates when they fall due: it owes them,
a debt counted in gradient steps (DQN: `gradient_steps` every `train_freq` env steps; PPO: a
completed rollout frozen into its epochs x minibatches steps, `learner.UpdatePlan`), and a
pacer pays it. The `train` section says how (`config()`):

- learn_in "request" (the default): each request pays at most `updates_per_request` steps,
  or twice what the schedule has owed per request on average so far (rounded down),
  whichever is more (so
  requests that each bring many env steps, e.g. 256 env copies or a batch of local
  inference's experience, pay off what they bring instead of letting the debt grow), and
  stops before the next step once `max_update_seconds_per_request` have passed (at least
  one step runs per request, so the debt always shrinks). The debt left waits for the next
  requests; acting in between uses the weights as they stand (a PPO rollout keeps the
  log-prob of each action as it was taken, so the importance ratio stays right). The work
  of a request is thus bounded by config; the time guard only matters when steps are slow
  (a large model), and `updateBudgetHits` in the trainer's progress counts the requests it
  cut short. Reproducible: a seeded run given the same requests runs the same steps on the
  same data in the same order (the debt and PPO's plans are in the trainer's `state_dict`,
  so a resumed run does too), as long as the time guard never cuts a request short: that
  is the one place where timing changes what runs.
- learn_in "background": a learner thread pays the debt beside the request path, on a copy
  of the policy; the acting policy takes the newest weights at each request that brings
  transitions, and the trainer's other calls wait at most for the gradient step in
  progress. Not bit-reproducible: how many steps run between two requests depends on timing.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol

import torch

from mistk_rl.rl.config import AgentConfigError

LEARN_IN = ("request", "background")


def config(updates_per_request: int = 16) -> dict:
    """The `train` keys every trainer takes (module doc), with a trainer's own bound."""
    return {
        # where owed gradient steps run: "request" (deterministic) or "background" (a
        # learner thread; not bit-reproducible)
        "learn_in": "request",
        # the most gradient steps one request runs (a PPO minibatch is one step), unless the
        # schedule owes more per request on average: then twice that average (module doc);
        # the rest waits for the next requests (status: updatesOwed)
        "updates_per_request": updates_per_request,
        # a request starts no further step after this long (a slow model); null: no guard.
        # Keep it well under the orchestrator's --agent-timeout
        "max_update_seconds_per_request": 1.0,
    }


def check_config(train: Mapping[str, Any]) -> None:
    """A AgentConfigError naming the first bad pacing key of the user's `train` section."""
    if train.get("learn_in", "request") not in LEARN_IN:
        raise AgentConfigError(
            f"train.learn_in {train['learn_in']!r} is not one of {', '.join(LEARN_IN)}"
        )
    limit = train.get("updates_per_request", 1)
    if type(limit) is not int or limit < 1:
        raise AgentConfigError(
            f"train.updates_per_request must be a positive integer, not {limit!r}"
        )
    seconds = train.get("max_update_seconds_per_request")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0
    ):
        raise AgentConfigError(
            f"train.max_update_seconds_per_request must be a positive number "
            f"or null, not {seconds!r}"
        )


class Debtor(Protocol):
    """What a pacer pays for: a trainer's owed gradient steps."""

    def owed(self) -> int:
        """Gradient steps owed now."""

    def pay_one(self) -> bool:
        """Run one owed step; False: none can run now (what is owed waits or was dropped)."""


class Pacer:
    """learn_in "request": pays a bounded number of steps in the calling request."""

    def __init__(
        self,
        debtor: Debtor,
        train: Mapping[str, Any],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.debtor, self.clock = debtor, clock
        self.limit = train["updates_per_request"]
        self.seconds = train["max_update_seconds_per_request"]
        self.budget_hits = 0  # requests the time guard cut short
        # the rate the schedule owes at: steps it added to the debt over the requests so far
        self.arrived, self.requests = 0, 0
        self._left = 0  # the debt the last request left

    def request_limit(self) -> int:
        """This request's most steps: `updates_per_request`, or twice the steps owed per
        request on average, whichever is more (a debt that arrives faster than the fixed
        bound drains too)."""
        owed = self.debtor.owed()
        self.arrived += max(0, owed - self._left)
        self.requests += 1
        return max(self.limit, 2 * self.arrived // self.requests)

    def pay(self) -> int:
        """Run owed steps, at most `request_limit()`, none started after the time budget
        (the first always runs); how many ran."""
        done, start, limit = 0, self.clock(), self.request_limit()
        while done < limit and self.debtor.owed() > 0:
            if done and self.seconds is not None and self.clock() - start >= self.seconds:
                self.budget_hits += 1
                break
            if not self.debtor.pay_one():
                break
            done += 1
        self._left = self.debtor.owed()
        return done

    def state_dict(self) -> dict:
        """The owed rate's counts (a resumed run bounds its requests as the original did)."""
        return {"arrived": self.arrived, "requests": self.requests, "left": self._left}

    def load_state_dict(self, state: Optional[dict]) -> None:
        state = state or {}  # (checkpoints from before the rate: none)
        self.arrived, self.requests = int(state.get("arrived", 0)), int(state.get("requests", 0))
        self._left = int(state.get("left", self.debtor.owed()))

    def paused(self) -> contextlib.AbstractContextManager:
        """A block during which no learning runs (nothing runs beside a request here)."""
        return contextlib.nullcontext()

    def progress(self) -> dict[str, Any]:
        return {
            "learnIn": "request",
            "updatesOwed": self.debtor.owed(),
            "updateBudgetHits": self.budget_hits,
        }

    def close(self) -> None:
        """Nothing runs beside a request."""


class BackgroundPacer(Pacer):
    """learn_in "background": a learner thread pays the debt one step at a time on
    `learning`, a copy of the acting policy `acting` (module doc). The trainer's own calls
    hold `paused()`, so the thread never steps while the request path reads or changes the
    trainer, the replay or the learning weights."""

    def __init__(
        self, debtor: Debtor, train: Mapping[str, Any], acting: Any, learning: Any
    ) -> None:
        super().__init__(debtor, train)
        self.acting, self.learning = acting, learning
        self._cond = threading.Condition(threading.RLock())
        self._waiting = 0  # request-path callers queued for the lock: the thread yields
        self._waiting_lock = threading.Lock()
        self._stalled = False  # the debtor could not pay: wait for the next request
        self._stop = False
        self._steps = 0  # steps run since the last `pay`
        self._published: Optional[dict[str, torch.Tensor]] = None
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    @staticmethod
    def split(policy: Any) -> Any:
        """The copy of `policy` a learner thread trains (weights, optimiser, generators)."""
        return copy.deepcopy(policy)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._waiting_lock:
            self._waiting += 1
        with self._cond:
            with self._waiting_lock:
                self._waiting -= 1
            yield
            self._cond.notify_all()

    def pay(self) -> int:
        """Hand the debt to the thread (started at the first call), take the newest weights
        into the acting policy; how many steps ran since the last call. A step that raised
        in the thread raises here."""
        with self.paused():
            if self._error is not None:
                raise RuntimeError(f"background learning failed: {self._error}") from self._error
            self.sync()
            done, self._steps, self._stalled = self._steps, 0, False
            if self._thread is None and not self._stop:
                self._thread = threading.Thread(target=self._run, name="learner", daemon=True)
                self._thread.start()
        return done

    def sync(self) -> None:
        """Copy the newest learned weights into the acting policy (the request path calls
        this, so acting never reads weights a step is writing)."""
        with self.paused():
            if self._published is not None:
                self.acting.model.load_state_dict(self._published)
                self._published = None

    def publish_now(self) -> None:
        """The learning weights changed outside a step (a checkpoint was loaded): act with
        them from now on."""
        with self.paused():
            self.acting.model.load_state_dict(self.learning.model.state_dict())
            self._published = None

    def progress(self) -> dict[str, Any]:
        with self.paused():
            return {
                "learnIn": "background",
                "updatesOwed": self.debtor.owed(),
                "updateBudgetHits": 0,
            }

    def close(self) -> None:
        """Stop the thread after the step in progress and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        with self._cond:
            while True:
                self._cond.wait_for(
                    lambda: (
                        self._stop
                        or (not self._waiting and not self._stalled and self.debtor.owed() > 0)
                    )
                )
                if self._stop:
                    return
                try:
                    if self.debtor.pay_one():
                        self._steps += 1
                        self._published = {
                            k: v.detach().clone()
                            for k, v in self.learning.model.state_dict().items()
                        }
                    else:
                        self._stalled = True
                except BaseException as exc:  # noqa: BLE001 (the next request raises it)
                    self._error = exc
                    return
