"""OpenTelemetry export (the otel extra): an orchestrator and an agent started with an OTLP
endpoint send their request spans to a collector this test runs on loopback (OTLP/HTTP,
protobuf, decoded with opentelemetry-proto); one traced run's spans form one tree: the
orchestrator's under the caller's span, the agent's calls the orchestrator made under the
orchestrator's spans."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import GYM_ORCHESTRATOR, RANDOM_AGENT
from tests.test_traced_logs import traced_run

trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="needs the otel extra (pip install 'mistk-rl[otel]')",
)


class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, as (service, span) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service.ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    for resource_spans in request.resource_spans:
                        name = next(
                            a.value.string_value
                            for a in resource_spans.resource.attributes
                            if a.key == "service.name"
                        )
                        for scope in resource_spans.scope_spans:
                            collector.spans += [(name, span) for span in scope.spans]
                answer = trace_service.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def of(self, trace_id: str) -> list[tuple[str, object]]:
        with self.lock:
            return [(n, s) for n, s in self.spans if s.trace_id.hex() == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_one_runs_spans_reach_the_collector_as_one_tree(launch, monkeypatch):
    collector = Collector()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # ms between batches
        orch_service = launch("orchestrator", GYM_ORCHESTRATOR)
        agent_service = launch("agent", RANDOM_AGENT)
        trace = traced_run(orch_service, agent_service)
        want = {
            ("mistk-rl-orchestrator", "registerAgent"),
            ("mistk-rl-agent", "agentRegistered"),
            ("mistk-rl-agent", "episodeStarted"),
        }
        deadline = time.monotonic() + 30
        while not want <= {(n, s.name) for n, s in collector.of(trace.trace_id)}:
            assert time.monotonic() < deadline, collector.of(trace.trace_id)
            time.sleep(0.1)  # (the services' batches come every 100 ms)
        spans = collector.of(trace.trace_id)
        by_id = {s.span_id.hex(): (n, s) for n, s in spans}
        register = next(s for n, s in spans if s.name == "registerAgent")
        # the caller's span is this test's (not exported): the orchestrator's is under it
        assert register.parent_span_id.hex() == trace.span_id
        # the agentRegistered the orchestrator sent while registering: under its span
        registered = next(s for n, s in spans if s.name == "agentRegistered")
        assert by_id[registered.parent_span_id.hex()][1].name == "registerAgent"
        assert registered.kind == registered.SPAN_KIND_SERVER
        status = next(a for a in registered.attributes if a.key == "http.response.status_code")
        assert status.value.int_value == 200
        assert registered.end_time_unix_nano >= registered.start_time_unix_nano > 0
        assert all(s.name != "getAction" for _, s in spans)  # (per-step: only at DEBUG)
    finally:
        collector.close()
