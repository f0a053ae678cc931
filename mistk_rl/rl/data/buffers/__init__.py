"""Replay buffers behind one interface (``ReplayBuffer``), chosen by an agent config's
``buffer.type`` (``BUFFERS``):

- ``NaiveReplayBuffer``: FIFO ring, uniform sampling without replacement.
- ``AdvancedReplayBuffer``: prioritized replay, max-use / staleness removal, throughput
  control and statistics.
"""

from mistk_rl.rl.data.buffers.advanced import AdvancedReplayBuffer
from mistk_rl.rl.data.buffers.base import ReplayBuffer
from mistk_rl.rl.data.buffers.naive import NaiveReplayBuffer
from mistk_rl.rl.data.buffers.throughput import ThroughputController

BUFFERS: dict[str, type[ReplayBuffer]] = {
    "naive": NaiveReplayBuffer,
    "advanced": AdvancedReplayBuffer,
}

__all__ = [
    "AdvancedReplayBuffer",
    "BUFFERS",
    "NaiveReplayBuffer",
    "ReplayBuffer",
    "ThroughputController",
]
