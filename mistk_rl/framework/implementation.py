"""What agents and orchestrators share: the service attaches itself here, and hooks use it to
report progress and to notice cancellation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mistk_rl.files import resolve_in
from mistk_rl.lifecycle import Lifecycle
from mistk_rl.limits import Limits

# per-step progress (env steps, updates) wakes status long-polls at most this often: each
# wake costs every long-polling caller a round trip
PROGRESS_EVERY_S = 1.0


@dataclass(frozen=True)
class Metric:
    """One sample of what an implementation counts, exposed at its service's ``/metrics`` as
    ``mistk_<name>`` (`mistk_rl.service.metrics`). Read when Prometheus scrapes, never on a
    step: implementations keep their counts as they would anyway and say what they are here.
    Names follow Prometheus' conventions: a counter's ends in ``_total``, a unit's is a base
    unit (``_seconds``, ``_bytes``)."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


class ServiceImplementation:
    """Base of `AbstractAgent` and `AbstractOrchestrator` (not used directly)."""

    def __init__(self) -> None:
        self.data_dir: Path = Path.cwd()  # the service sets its --data-dir here
        self.shares: dict[str, Path] = {}  # and its --share dirs
        self.limits = Limits()  # and the limits it was started with
        self._lifecycle: Optional[Lifecycle] = None

    def resolve_path(self, path: str) -> Path:
        """`path` as callers name files: inside the data dir, or a share (`resolve_in`)."""
        return resolve_in(self.data_dir, path, self.shares)

    def update_status(self, payload: dict[str, Any], every_s: float = 0.0) -> None:
        """Merge progress (e.g. {"updates": 120, "loss": 0.3}) into the status payload; wakes
        every long-poll on status, at most once every `every_s` seconds (for progress
        reported per step: status still shows the latest values)."""
        if self._lifecycle is not None:
            self._lifecycle.update_payload(payload, every_s)

    def metrics(self) -> list[Metric]:
        """What this implementation counts, for ``/metrics`` (`Metric`). Called on the
        service's event loop at each scrape: read counters, compute nothing heavy."""
        return []

    @property
    def should_stop(self) -> bool:
        """True once the running hook was cancelled (reset, terminate, stopEpisode): return
        soon."""
        return self._lifecycle is not None and self._lifecycle.cancel_requested

    def wait_for_cancel(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds, waking early if the running hook is cancelled;
        returns True when it was (use instead of time.sleep inside hooks)."""
        event = self._lifecycle.current_cancel_event() if self._lifecycle else None
        if event is None:
            raise RuntimeError("wait_for_cancel is for use inside a running hook")
        return event.wait(timeout)
