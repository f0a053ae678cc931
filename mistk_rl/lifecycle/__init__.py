"""Lifecycles: transition tables (`tables`) and the runner that fires them (`machine`)."""

from mistk_rl.lifecycle.machine import Lifecycle, Task
from mistk_rl.lifecycle.tables import AGENT, ORCHESTRATOR, Operation, Table

__all__ = ["AGENT", "ORCHESTRATOR", "Lifecycle", "Operation", "Table", "Task"]
