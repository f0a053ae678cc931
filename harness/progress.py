"""What a training run shows while it runs: a progress bar on a terminal (env steps, steps/s,
the last evaluation), plain lines every `PLAIN_EVERY_S` seconds otherwise (logs, CI, pipes),
so nothing scrolls a log full of carriage returns."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

PLAIN_EVERY_S = 10.0


class TrainingProgress:
    def __init__(
        self,
        total_steps: int,
        done_steps: int = 0,
        stream: TextIO = sys.stdout,
        quiet: bool = False,
        say: Optional[Callable[[str], None]] = None,
        unit: str = "env steps",
        eval_label: str = "last eval",
    ) -> None:
        """Lines go to `say` (default: print to `stream`) unless a bar is shown. `unit`:
        what the steps count (games count the evaluated agent's moves)."""
        self.total, self.steps, self.stream, self.quiet = total_steps, done_steps, stream, quiet
        self.unit, self.eval_label = unit, eval_label
        self.say = say or (lambda message: print(message, file=stream, flush=True))
        self.last_eval: Optional[float] = None
        self._started, self._start_steps = time.monotonic(), done_steps
        self._next_line = self._started + PLAIN_EVERY_S
        self._bar = None
        if not quiet and stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=done_steps,
                unit="step",
                desc="training",
                file=stream,
                dynamic_ncols=True,
                unit_scale=True,
                leave=True,
            )

    def update(self, steps: int) -> None:
        """The run has taken `steps` training env steps in all."""
        steps = min(steps, self.total)
        if self._bar is not None:
            self._bar.update(steps - self.steps)
        self.steps = steps
        if self._bar is None and not self.quiet and time.monotonic() >= self._next_line:
            self._next_line = time.monotonic() + PLAIN_EVERY_S
            self.write(self.line())

    def evaluated(self, mean_return: float) -> None:
        self.last_eval = mean_return
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.eval_label} {mean_return:.2f}")

    def line(self) -> str:
        """One plain line: where the run stands."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = (self.steps - self._start_steps) / elapsed
        last = "none yet" if self.last_eval is None else f"{self.last_eval:.2f}"
        return (
            f"  training: {self.steps:,}/{self.total:,} {self.unit} "
            f"({100 * self.steps / max(self.total, 1):.1f}%), {rate:,.0f} steps/s, "
            f"{self.eval_label} {last}"
        )

    def write(self, message: str) -> None:
        """A line of output that does not break the bar."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            self.say(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
