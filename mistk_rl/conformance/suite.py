"""What every role's checks share: recording verdicts, reading the status, waiting for work
to end, and the checks the lifecycle tables imply for any state (the operations `status`
lists, each one the table forbids refused with 409 and the state unchanged).

A check records its verdict and the exchange behind it, and the suite goes on: a person
gets every failure in one run. Only a service that stops answering ends the run early.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Optional

from mistk_rl.conformance.contract import PROBLEM, Contract, contract
from mistk_rl.conformance.probe import Probe, Reply
from mistk_rl.conformance.report import Check, Report
from mistk_rl.lifecycle.machine import api_name
from mistk_rl.lifecycle.tables import Table

CallArgs = dict[str, Any]  # Probe.call's keyword arguments


class ServiceGone(Exception):
    """The service stopped answering: nothing after this can be checked."""


# operations that fire another operation's trigger (the columnar forms of the step path)
ALIASES = {"stepColumns": "step", "replayColumns": "replayAction"}


def allowed_by(table: Table, state: str) -> set[str]:
    """The operations (operationIds) the table allows in `state`."""
    legal = set()
    for row in table.transitions:
        sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
        if state in sources and row["trigger"] in table.operations:
            legal.add(api_name(row["trigger"]))
    return legal


def legal_in(table: Table, state: str, operation_id: str) -> bool:
    return ALIASES.get(operation_id, operation_id) in allowed_by(table, state)


class Suite:
    """One run of the checks against one service."""

    role: str = ""
    table: Table

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        timeout: float = 30.0,
        wait: float = 120.0,
        terminate: bool = True,
    ) -> None:
        self.contract: Contract = contract(self.role)
        self.probe = Probe(url, self.contract, token=token, timeout=timeout)
        self.report = Report(self.role, self.probe.base_url)
        self.token = token
        self.wait_s = wait  # the longest any background work may take
        self.terminate_at_end = terminate
        self.capabilities: list[str] = []

    # ---- recording -----------------------------------------------------------------------
    def check(self, name: str, ok: bool, detail: str = "", answer: Optional[Reply] = None) -> bool:
        self.report.add(
            Check(
                f"{self.role}.{name}",
                bool(ok),
                "" if ok else detail,
                answer.exchange if answer is not None else None,
                answer.seconds if answer is not None else 0.0,
            )
        )
        return bool(ok)

    def call(self, operation_id: str, **kw: Any) -> Reply:
        answer = self.probe.call(operation_id, **kw)
        if answer.status == 0:
            self.check(f"answers.{operation_id}", False, "no answer", answer)
            raise ServiceGone(f"{operation_id}: {answer.exchange.error}")
        return answer

    def expect(self, name: str, operation_id: str, statuses: Iterable[int], **kw: Any) -> Reply:
        """Call, and check the status is one of `statuses` and the answer keeps the
        contract (its status documented, its content type listed, its body valid)."""
        answer = self.call(operation_id, **kw)
        wanted = set(statuses)
        problems = [] if answer.status in wanted else [f"expected {_alts(wanted)}"]
        problems += self.contract.answer_problems(
            operation_id, answer.status, answer.content_type, answer.body
        )
        self.check(name, not problems, "; ".join(problems), answer)
        return answer

    # ---- the status ----------------------------------------------------------------------
    def status(self, **params: Any) -> Reply:
        return self.call("status", params=params or None)

    def state(self) -> Optional[str]:
        return self.status().field("state")

    def settle(self, name: str, want: Optional[str] = None) -> Optional[str]:
        """Follow the long-poll until the service rests (no work running) and check it
        rests in `want`; the state it rests in, or None if it never did."""
        deadline = time.monotonic() + self.wait_s
        answer = self.status()
        while answer.field("state") in self.table.busy_states and time.monotonic() < deadline:
            version = answer.field("resourceVersion")
            poll = {"resourceVersion": version, "timeout": 5} if isinstance(version, int) else {}
            answer = self.status(**poll)
        state = answer.field("state")
        if state in self.table.busy_states:
            self.check(name, False, f"still {state!r} after {self.wait_s:.0f} s", answer)
            return None
        if want is not None:
            detail = f"expected to rest in {want!r}, rests in {state!r}"
            if state == "failed":
                detail += f" (reason: {answer.field('reason')})"
            self.check(name, state == want, detail, answer)
        return state

    # ---- what the table implies in a state -----------------------------------------------
    def check_state(self, state: str, calls: dict[str, Callable[[], CallArgs]]) -> None:
        """In `state` (reached already): status lists what the table allows, and each
        operation the table forbids (of those in `calls`) is refused, changing nothing."""
        answer = self.status()
        legal = allowed_by(self.table, state)
        listed = answer.field("allowed")
        if listed is not None:  # (optional in the spec; checked when given)
            aliases = {a for a, of in ALIASES.items() if of in legal}
            self.check(
                f"{state}.status.allowed",
                legal <= set(listed) <= legal | aliases,
                f"status lists {sorted(listed)}; the table allows {sorted(legal)}",
                answer,
            )
        for operation_id, args in calls.items():
            if not legal_in(self.table, state, operation_id):
                self.refused(f"{state}.{operation_id}.refused", operation_id, state, **args())

    def refused(self, name: str, operation_id: str, state: str, **kw: Any) -> None:
        """409 problem+json (its `state` the state, when given) and the state unchanged."""
        answer = self.call(operation_id, **kw)
        problems = []
        if answer.status != 409:
            problems.append(f"the table forbids {operation_id} in {state!r}: expected 409")
        elif not answer.content_type.startswith(PROBLEM):
            problems.append(f"409 must be {PROBLEM}, is {answer.content_type or '(none)'}")
        else:
            problems += self.contract.answer_problems(
                operation_id, 409, answer.content_type, answer.body
            )
            said = answer.field("state")
            if said is not None and said != state:
                problems.append(f"the problem says state {said!r}, the service is in {state!r}")
        now = self.state()
        if now != state:
            problems.append(f"the state changed: {state!r} -> {now!r}")
            self.settle(f"{name}.settles")
        self.check(name, not problems, "; ".join(problems), answer)

    def bad_input(self, name: str, operation_id: str, state: str, **kw: Any) -> Reply:
        """A 4xx problem (400 unless the status says otherwise) and the state unchanged."""
        answer = self.call(operation_id, **kw)
        problems = []
        if not 400 <= answer.status < 500 or answer.status in (401, 409):
            problems.append(f"bad input must be refused with 400 (or 413/415), got {answer.status}")
        else:
            problems += self.contract.answer_problems(
                operation_id, answer.status, answer.content_type, answer.body
            )
        now = self.state()
        if now != state:
            problems.append(f"the state changed: {state!r} -> {now!r}")
        self.check(name, not problems, "; ".join(problems), answer)
        return answer

    # ---- what holds whatever the state ---------------------------------------------------
    def check_api_version(self) -> None:
        answer = self.expect("apiVersion.answers", "apiVersion", [200], token=None)
        body = answer.json if isinstance(answer.json, dict) else {}
        self.check(
            "apiVersion.role",
            body.get("role") == self.role,
            f"role {body.get('role')!r}, expected {self.role!r}",
            answer,
        )
        version = str(body.get("version", ""))
        ours = self.contract.version
        self.check(
            "apiVersion.major",
            version.split(".")[0] == ours.split(".")[0],
            f"speaks {version!r}; this kit checks contract {ours} (same major version needed)",
            answer,
        )
        self.capabilities = [c for c in body.get("capabilities") or [] if isinstance(c, str)]

    def check_token(self) -> None:
        """With a token configured: none, or a wrong one, is 401 problem+json."""
        if not self.token:
            return
        for name, token in (("missing", None), ("wrong", self.token + "-wrong")):
            answer = self.call("status", token=token)
            problems = [] if answer.status == 401 else [f"expected 401, got {answer.status}"]
            problems += self.contract.answer_problems(
                "status", answer.status, answer.content_type, answer.body
            )
            self.check(f"token.{name}.refused", not problems, "; ".join(problems), answer)

    def check_long_poll(self, state: str, change: Callable[[], Reply]) -> None:
        """With the current resourceVersion the status waits: unchanged at its timeout,
        woken by a change (`change` makes one, from `state`); a version ahead of the
        service's answers at once."""
        now = self.status()
        version = now.field("resourceVersion")
        if not self.check(
            "status.resourceVersion", isinstance(version, int), "not an integer", now
        ):
            return
        quiet = self.status(resourceVersion=version, timeout=1)
        self.check(
            "longPoll.times-out-unchanged",
            quiet.field("resourceVersion") == version and quiet.field("state") == state,
            f"expected version {version} in {state!r} after the timeout, "
            f"got {quiet.field('resourceVersion')} in {quiet.field('state')!r}",
            quiet,
        )
        self.check(
            "longPoll.waits",
            quiet.seconds >= 0.5,
            f"answered after {quiet.seconds:.2f} s; a long-poll on the current version "
            "waits for a change or its timeout (1 s asked)",
            quiet,
        )
        woken: list[Reply] = []
        poll = threading.Thread(
            target=lambda: woken.append(
                self.probe.call(
                    "status", params={"resourceVersion": version, "timeout": 30}, timeout=60
                )
            ),
            daemon=True,
        )
        poll.start()
        changed = change()
        poll.join(60)
        got = woken[0] if woken else None
        moved = got is not None and (got.field("resourceVersion") or -1) > version
        self.check(
            "longPoll.woken-by-change",
            moved,
            f"a long-poll on version {version} did not answer a later version after "
            f"{changed.exchange.method} {changed.exchange.url}",
            got,
        )
        ahead = self.status(resourceVersion=(version + 10**9), timeout=30)
        self.check(
            "longPoll.ahead-answers",
            ahead.status == 200 and ahead.seconds < 25,
            "a resourceVersion ahead of the service's must answer at once (another instance)",
            ahead,
        )
        for name, params in (
            ("negative", {"resourceVersion": -1}),
            ("timeout-too-long", {"resourceVersion": 0, "timeout": 1000}),
        ):
            self.bad_input(
                f"longPoll.{name}.bad-input", "status", self.state() or "", params=params
            )

    def check_files(self, state: str) -> None:
        """putFile then getFile give back the same bytes; a missing file is 404, a path
        out of the data dir 400."""
        data = bytes(range(256)) * 4
        put = self.expect(
            "files.putFile.answers",
            "putFile",
            [200],
            params={"path": "conformance/probe.bin"},
            raw=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        self.check(
            "files.putFile.size",
            put.field("bytes") == len(data),
            f"bytes {put.field('bytes')}, sent {len(data)}",
            put,
        )
        got = self.expect(
            "files.getFile.answers", "getFile", [200], params={"path": "conformance/probe.bin"}
        )
        self.check("files.getFile.same-bytes", got.body == data, "not the bytes put", got)
        self.expect("files.getFile.missing", "getFile", [404], params={"path": "conformance/none"})
        self.bad_input(
            "files.getFile.outside", "getFile", state, params={"path": "../../etc/passwd"}
        )

    def check_terminate(self, calls: dict[str, Callable[[], CallArgs]]) -> None:
        """terminate answers, then only status does: every other operation is refused."""
        self.expect("terminate.answers", "terminate", [200])
        state = self.settle("terminate.settles", "terminated")
        if state != "terminated":
            return
        for operation_id, args in calls.items():
            if operation_id != "terminate":
                self.refused(f"terminated.{operation_id}.refused", operation_id, state, **args())

    def run(self) -> Report:
        try:
            self.check_api_version()
            self.check_token()
            self.scenario()
        except ServiceGone as exc:
            self.report.aborted = f"the service stopped answering: {exc}"
        finally:
            self.probe.close()
            self.close()
        return self.report

    def scenario(self) -> None:  # each role's checks, in order
        raise NotImplementedError

    def calls(self) -> dict[str, Callable[[], CallArgs]]:
        """Each operation of the role, by operationId, as the call that tries it."""
        raise NotImplementedError

    def opened(self) -> bool:
        """Every walk's opening: status answers, reset answers 202 and the service settles
        in the table's initial state, where the table's rules are checked. False when it
        did not get there (what went wrong is in the report)."""
        initial = self.table.initial
        self.expect("status.answers", "status", [200])
        self.expect("reset.answers", "reset", [202])
        if self.settle("reset.settles", initial) != initial:
            return False
        self.check_state(initial, self.calls())
        return True

    def close(self) -> None:  # what a role's suite started
        pass


def _alts(statuses: set[int]) -> str:
    return " or ".join(str(s) for s in sorted(statuses))
