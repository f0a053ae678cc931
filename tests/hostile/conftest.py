"""The hostile-client suite (issue 57 item 7): floods, bursts, idle and half-sent streams,
slow readers and oversized frames against a real agent service. It runs inside a
loopback-only network namespace (`tests/test_hostile.py` starts it there with ``unshare
--net``), where nothing but 127.0.0.1 exists."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _in_the_namespace() -> None:
    if os.environ.get("MISTK_RL_NETNS") != "1":
        pytest.skip("runs in a loopback-only namespace: tests/test_hostile.py starts it")
