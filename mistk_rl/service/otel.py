"""OpenTelemetry export (``pip install mistk-rl[otel]``): every request a service answers
within a trace becomes a span sent to an OTLP/HTTP collector, so one episode's calls show
in Jaeger, Tempo or any OTLP backend as one tree across the harness, the orchestrator and
its agents.

Off unless the standard variable ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the exporter reads them, and ``OTEL_BSP_*`` for its
batching). The spans are the ones the services' log lines already name
(`mistk_rl.wire.tracing`): the trace id and this service's span id are those it passes on
in ``traceparent``, the parent the caller's; so a collector joins them without any
instrumentation of the handlers. Spans leave in batches from a thread of the worker: the
request path only hands a finished span over. Per-step requests are traced only at DEBUG,
as their log lines are.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from typing import Any, Optional

from mistk_rl.wire.tracing import Trace

log = logging.getLogger(__name__)

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class SpanExport:
    """Finished requests as server spans of `service_name`, batched to OTLP/HTTP."""

    def __init__(self, service_name: str, attributes: dict[str, str]) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.resource = Resource.create({"service.name": service_name, **attributes})
        self.processor = BatchSpanProcessor(OTLPSpanExporter())

    def served(self, operation: str, status: int, seconds: float, trace: Trace) -> None:
        """A span for one answered request: `operation` (the operationId), its HTTP status,
        ending now after `seconds`."""
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        end = time.time_ns()
        flags = TraceFlags(int(trace.flags, 16))
        context = SpanContext(int(trace.trace_id, 16), int(trace.span_id, 16), False, flags)
        parent = (
            None
            if trace.parent_id is None
            else SpanContext(int(trace.trace_id, 16), int(trace.parent_id, 16), True, flags)
        )
        self.processor.on_end(
            ReadableSpan(
                operation,
                context=context,
                parent=parent,
                resource=self.resource,
                attributes={"http.response.status_code": status},
                kind=SpanKind.SERVER,
                status=Status(StatusCode.ERROR if status >= 500 else StatusCode.UNSET),
                start_time=end - int(seconds * 1e9),
                end_time=end,
            )
        )

    def close(self) -> None:
        """Send what is batched (the worker is stopping)."""
        self.processor.shutdown()


def from_environment(role: str, implementation: Any) -> Optional[SpanExport]:
    """The export when an OTLP endpoint is configured (module doc), else None; a warning,
    not a failure, when the extra is not installed."""
    if not any(os.environ.get(name) for name in ENDPOINTS):
        return None
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        log.warning(
            "%s is set but OpenTelemetry is not installed (pip install 'mistk-rl[otel]'): "
            "no spans are exported",
            next(name for name in ENDPOINTS if os.environ.get(name)),
        )
        return None
    kind = type(implementation)
    export = SpanExport(
        os.environ.get("OTEL_SERVICE_NAME") or f"mistk-rl-{role}",
        {"mistk.role": role, "mistk.implementation": f"{kind.__module__}:{kind.__qualname__}"},
    )
    atexit.register(export.close)  # (the batch still held when the worker stops)
    return export
