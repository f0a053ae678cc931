"""W3C trace context across the services: one ``traceparent`` header
(``00-<trace id>-<parent span id>-<flags>``, https://www.w3.org/TR/trace-context/) ties
the harness's calls to the orchestrator's and the agents' that they cause.

`TRACE` holds the span the code runs in: a served request's (the pipeline sets it for the
handler: a child of the caller's span, or the root of a new trace when the caller sent
none) or a harness run's (`traced(new_trace())`). Every request the SDK sends in that
context carries its ``traceparent`` (`outgoing_line`), so the services' log lines of one
episode share its trace id. Threads do not inherit context variables: code that hands work
to a thread runs it in `contextvars.copy_context()` (the pipeline's pools, the lifecycle's
background tasks do).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

HEADER = "traceparent"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Trace:
    """A span: its trace's id (32 hex digits), its own id (16) and the trace flags."""

    trace_id: str
    span_id: str
    flags: str = "01"  # sampled
    parent_id: Optional[str] = None  # the caller's span, when one sent a traceparent
    line: str = field(init=False, repr=False, compare=False)  # the header line it sends

    def __post_init__(self) -> None:
        object.__setattr__(self, "line", f"{HEADER}: {self.header}\r\n")

    @property
    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


TRACE: ContextVar[Optional[Trace]] = ContextVar("mistk_rl_trace", default=None)


def _hex_id(digits: int) -> str:
    return os.urandom(digits // 2).hex()


def new_trace() -> Trace:
    """The root span of a new trace."""
    return Trace(_hex_id(32), _hex_id(16))


def parse(header: Union[str, bytes, None]) -> Optional[tuple[str, str, str]]:
    """(trace id, parent span id, flags) of a valid version-00 ``traceparent``, else None
    (a malformed or all-zero one is ignored, as the spec says: the request starts a new
    trace)."""
    if header is None:
        return None
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    header = header.strip().lower()
    if len(header) < 55 or header[2] != "-" or header[35] != "-" or header[52] != "-":
        return None
    version, trace_id, parent_id, flags = header[:2], header[3:35], header[36:52], header[53:55]
    if version == "ff" or not set(header[:55].replace("-", "")) <= _HEX:
        return None
    if version == "00" and len(header) != 55:
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return trace_id, parent_id, flags


def child_of(header: Union[str, bytes, None]) -> Trace:
    """A new span of the trace `header` names; the root of a new trace without one."""
    parsed = parse(header)
    if parsed is None:
        return new_trace()
    trace_id, parent_id, flags = parsed
    return Trace(trace_id, _hex_id(16), flags, parent_id)


def current() -> Optional[Trace]:
    return TRACE.get()


def outgoing_line() -> str:
    """The ``traceparent`` header line a request sent now carries ("" outside a trace)."""
    trace = TRACE.get()
    return "" if trace is None else trace.line


@contextmanager
def traced(trace: Optional[Trace] = None) -> Iterator[Trace]:
    """Run the block in `trace` (a new one by default): the requests it sends carry it."""
    trace = trace or new_trace()
    token = TRACE.set(trace)
    try:
        yield trace
    finally:
        TRACE.reset(token)
