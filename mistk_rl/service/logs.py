"""The services' log lines: one format for the service's own lines, gunicorn's and
uvicorn's, as text (the default) or JSON (``mistk-rl serve --log-format json``), and an
access line per answered request (`access`).

An access line names the operation, the status, the time in the server and the request's
ids: its own span (``request_id``) and its trace (``trace_id``, from the caller's
``traceparent``: `mistk_rl.wire.tracing`). Every other line logged while a request is
served carries the trace id too. Control operations and every refusal (4xx, 5xx) are
logged at INFO; the per-step operations and status (thousands a second in a run) at DEBUG.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Optional

from mistk_rl.wire.tracing import TRACE, Trace

ACCESS = logging.getLogger("mistk_rl.access")
# what an access line carries besides its message (JSON keys; text appends them)
ACCESS_FIELDS = ("operation", "status", "duration_ms", "request_id", "trace_id")


def access(
    operation: str, status: int, seconds: float, trace: Optional[Trace], quiet: bool
) -> None:
    """Log one answered request (module doc); `quiet`: a per-step operation or status."""
    level = logging.DEBUG if quiet and status < 400 else logging.INFO
    if not ACCESS.isEnabledFor(level):
        return
    duration_ms = round(seconds * 1e3, 3)
    ACCESS.log(
        level,
        "%s %d %.3f ms",
        operation,
        status,
        duration_ms,
        extra={
            "operation": operation,
            "status": status,
            "duration_ms": duration_ms,
            "request_id": trace.span_id if trace else None,
            "trace_id": trace.trace_id if trace else None,
        },
    )


def _ids(record: logging.LogRecord) -> dict[str, Any]:
    """The record's access fields, and the trace it was logged in."""
    fields = {key: getattr(record, key) for key in ACCESS_FIELDS if hasattr(record, key)}
    if fields.get("trace_id") is None:
        trace = TRACE.get()
        if trace is not None:
            fields["trace_id"], fields["span_id"] = trace.trace_id, trace.span_id
    return {key: value for key, value in fields.items() if value is not None}


def _timestamp(record: logging.LogRecord) -> str:
    """ISO 8601 in UTC, to the millisecond."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + (
        f".{int(record.msecs):03d}Z"
    )


class TextFormatter(logging.Formatter):
    """``TIME [PID] LEVEL LOGGER: message [trace=... request=...]``."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{_timestamp(record)} [{record.process}] {record.levelname} {record.name}: "
            f"{record.getMessage()}"
        )
        ids = _ids(record)
        if "trace_id" in ids:
            line += f" [trace={ids['trace_id']}"
            span = ids.get("request_id") or ids.get("span_id")
            line += f" request={span}]" if span else "]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, pid, and the ids."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            **_ids(record),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


FORMATTERS: dict[str, type[logging.Formatter]] = {"text": TextFormatter, "json": JsonFormatter}


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for a served process: the root logger and gunicorn's
    in the one format, to stderr (gunicorn applies it in the arbiter and the worker)."""
    if log_format not in FORMATTERS:
        raise ValueError(f"log format {log_format!r}: one of {', '.join(FORMATTERS)}")
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "mistk",
        "stream": "ext://sys.stderr",
    }
    one = {"level": level.upper(), "handlers": ["console"], "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"mistk": {"()": FORMATTERS[log_format]}},
        "handlers": {"console": handler},
        "root": {"level": level.upper(), "handlers": ["console"]},
        "loggers": {"gunicorn.error": one, "gunicorn.access": {**one, "level": "WARNING"}},
    }
