"""What a service shows an operator: ``GET /metrics`` (the Prometheus text format, written
by the official `prometheus_client`, in the classic 0.0.4 text format every Prometheus
reads), ``GET /healthz`` and ``GET /readyz``.

The step path pays for none of it but two clock reads and a few integer additions
(~0.3 us): the pipeline counts each answer in plain Python numbers
(`OperationCounts.observe`), and the families are built from those
numbers when Prometheus scrapes (`ServiceCollector`), with what the implementation counts
(`ServiceImplementation.metrics`), the lifecycle state, the step streams and the worker
process (prometheus_client's own process collector: memory, CPU, open files).

The three paths are open, as ``apiVersion`` is, even with a token configured: probes and
scrapers of a container platform carry no bearer token, and they show counts and states,
never bodies. Bind the service to a private address (or put it behind a proxy that
filters them) where that is too much.

``/healthz`` says the worker's event loop answers: 200 while it runs, whatever the
lifecycle and the thread pools are doing (a busy learner or a pool held by blocked
handlers leaves a live service alive). ``/readyz`` says whether the service takes its next
operation now: 503 while it is busy (a state the table marks busy: initializing, building,
...), failed or terminated, and 200 otherwise; both bodies name the state.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Iterable, Iterator, Union

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.process_collector import ProcessCollector

from mistk_rl.wire.jsonable import dumps

PREFIX = "mistk"
METRICS_PATH, HEALTH_PATH, READY_PATH = "/metrics", "/healthz", "/readyz"
PROBE_PATHS = frozenset({METRICS_PATH, HEALTH_PATH, READY_PATH})
# latency buckets (seconds): a getAction on loopback takes ~70 us, a buildModel seconds
BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
NOT_READY = frozenset({"failed", "terminated"})


class OperationCounts:
    """One operation's answers by status, and its latency histogram (`BUCKETS`), as plain
    numbers. Only the event loop's thread counts (every answer is rendered there, whichever
    thread ran the handler) and reads them (the scrape), so no lock is needed."""

    def __init__(self) -> None:
        self.statuses: dict[int, int] = {}
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.seconds = 0.0

    def observe(self, status: int, seconds: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.buckets[bisect_left(BUCKETS, seconds)] += 1
        self.seconds += seconds


class RequestCounts:
    """`OperationCounts` per operation, and their families at a scrape."""

    def __init__(self, operations: Iterable[str]) -> None:
        self.of = {op: OperationCounts() for op in operations}

    def families(self) -> Iterator[Metric]:
        """(On the event loop, as the counting: nothing changes while they are built.)"""
        requests = CounterMetricFamily(
            f"{PREFIX}_requests",
            "Requests answered, by operation (the spec's operationId) and HTTP status; each "
            "frame of a step stream counts as a request of its operation",
            labels=("operation", "status"),
        )
        for op, counts in self.of.items():
            for status, count in sorted(counts.statuses.items()):
                requests.add_metric((op, str(status)), count)
        yield requests
        latency = HistogramMetricFamily(
            f"{PREFIX}_request_duration_seconds",
            "Time from a request to its answer in the server, by operation (reading the "
            "body, decoding, validation, the handler and rendering; not the network)",
            labels=("operation",),
        )
        for op, counts in self.of.items():
            if not counts.statuses:  # (no answer yet: no sample)
                continue
            cumulative, running = [], 0
            for bound, count in zip((*map(str, BUCKETS), "+Inf"), counts.buckets):
                running += count
                cumulative.append((bound, running))
            latency.add_metric((op,), cumulative, counts.seconds)
        yield latency


class ServiceCollector:
    """The families of one service (module doc), built at each scrape."""

    def __init__(self, pipeline: Any) -> None:  # (a ServicePipeline, which imports this)
        self.pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        pipeline = self.pipeline
        service, lifecycle = pipeline.service, pipeline.lifecycle
        info = InfoMetricFamily(f"{PREFIX}_service", "What this service is")
        info.add_metric(
            (),
            {
                "role": service.role,
                "implementation": f"{type(service.impl).__module__}:"
                f"{type(service.impl).__qualname__}",
                "instance": lifecycle.instance,
            },
        )
        yield info
        state = GaugeMetricFamily(
            f"{PREFIX}_lifecycle_state",
            "1 for the lifecycle state the service is in, 0 for the others",
            labels=("state",),
        )
        for name in lifecycle.table.states:
            state.add_metric((name,), 1.0 if name == lifecycle.state else 0.0)
        yield state
        yield CounterMetricFamily(
            f"{PREFIX}_lifecycle_changes",
            "Lifecycle changes since the service started (its status resourceVersion)",
            value=lifecycle.version,
        )
        yield from pipeline.requests.families()
        yield GaugeMetricFamily(
            f"{PREFIX}_status_long_polls",
            "Status long-polls waiting now",
            value=pipeline.long_polls,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_step_streams_open", "Step streams open now", value=pipeline.streams_open
        )
        yield CounterMetricFamily(
            f"{PREFIX}_step_streams_opened",
            "Step streams opened since the service started",
            value=pipeline.streams_opened,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_step_stream_frames",
            "Frames answered on step streams",
            value=pipeline.stream_frames,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_buffered_bytes",
            "Bytes held of step frames and request bodies not yet whole, over all "
            "connections (bounded by the limit max_buffered_bytes)",
            value=pipeline.held_bytes,
        )
        yield from implementation_families(service.impl.metrics())


def implementation_families(samples: Iterable[Any]) -> Iterator[Metric]:
    """`ServiceImplementation.metrics`' samples as families, one per name (a counter's
    name is given with ``_total``; prometheus_client adds it back)."""
    families: dict[str, Union[CounterMetricFamily, GaugeMetricFamily]] = {}
    for sample in samples:
        name = f"{PREFIX}_{sample.name}"
        family = families.get(name)
        if family is None:
            labels = [key for key, _ in sample.labels]
            if sample.kind == "counter":
                family = CounterMetricFamily(
                    name.removesuffix("_total"), sample.help, labels=labels
                )
            else:
                family = GaugeMetricFamily(name, sample.help, labels=labels)
            families[name] = family
        family.add_metric([value for _, value in sample.labels], float(sample.value))
    yield from families.values()


class Probes:
    """The answers at `PROBE_PATHS` of one service (module doc)."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServiceCollector(pipeline))
        ProcessCollector(namespace=PREFIX, registry=self.registry)

    def answer(self, path: str) -> tuple[int, bytes, bytes]:
        """The status, Content-Type and body at `path` (one of `PROBE_PATHS`)."""
        if path == METRICS_PATH:
            return 200, CONTENT_TYPE_PLAIN_0_0_4.encode(), generate_latest(self.registry)
        lifecycle = self.pipeline.lifecycle
        state = lifecycle.state
        if path == HEALTH_PATH:
            return 200, b"application/json", dumps({"alive": True, "state": state})
        busy = state in lifecycle.table.busy_states
        ready = not busy and state not in NOT_READY
        body: dict[str, Any] = {"ready": ready, "state": state}
        if not ready:
            body["reason"] = (
                f"busy in {state!r}" if busy else f"{state}: {lifecycle.reason or 'no reason'}"
            )
        return 200 if ready else 503, b"application/json", dumps(body)
