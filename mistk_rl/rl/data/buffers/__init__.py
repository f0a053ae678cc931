"""Replay buffers behind one interface (``ReplayBuffer``):

- ``NaiveReplayBuffer``: FIFO ring, uniform sampling without replacement.
- ``AdvancedReplayBuffer``: prioritized replay, max-use / staleness removal, throughput
  control and statistics.
- ``EpisodeReplayBuffer``: whole episodes, or fixed-length windows for recurrent learners.
"""
from mistk_rl.rl.data.buffers.advanced import AdvancedReplayBuffer
from mistk_rl.rl.data.buffers.base import ReplayBuffer
from mistk_rl.rl.data.buffers.episode import EpisodeReplayBuffer
from mistk_rl.rl.data.buffers.naive import NaiveReplayBuffer
from mistk_rl.rl.data.buffers.throughput import ThroughputController

__all__ = ["AdvancedReplayBuffer", "EpisodeReplayBuffer", "NaiveReplayBuffer", "ReplayBuffer",
           "ThroughputController"]
