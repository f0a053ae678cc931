"""The per-row definition of n-step items: one stream, a transition at a time, as the library
computed them before it worked on columns. `NStepColumns` is checked against it
(tests/rl/test_transition_batch.py), and the n-step rules are tested on it (test_returns)."""

from __future__ import annotations

from collections import deque

from mistk_rl.rl.data.returns import check_nstep


def _nstep_item(first: dict, last: dict, reward: float, m: int, gamma: float) -> dict:
    """The n-step transition from step ``first`` whose window of ``m`` steps ends at ``last``.

    ``terminated`` / ``truncated`` come from the window's last step: an episode end can only
    be there, since a window never crosses one.
    """
    item = {
        **first,
        "reward": float(reward),
        "next_obs": last["next_obs"],
        "terminated": bool(last["terminated"]),
        "truncated": bool(last["truncated"]),
        "gamma_n": float(gamma**m),
    }
    if "next_action_mask" in last:  # the legal actions belong to next_obs, the window's end
        item["next_action_mask"] = last["next_action_mask"]
    return item


def _ends_episode(step: dict) -> bool:
    return bool(step["terminated"]) or bool(step["truncated"])


class NStepAccumulator:
    """n-step transitions of a stream that arrives one transition at a time.

    Item t: reward = sum_{k<m} gamma^k r_{t+k} with m = min(n, steps to the episode's end,
    inclusive, or to the stream's cut); next_obs of step t+m-1; gamma_n = gamma**m, so the
    learner's target is reward + gamma_n * (1 - terminated) * Q(next_obs). Other keys are
    copied from step t. ``push`` returns the items it completes: the oldest pending one once n
    are pending, or all pending ones when the pushed transition ends the episode. Call
    ``flush`` when a stream is cut without an episode end.
    """

    def __init__(self, n: int, gamma: float) -> None:
        check_nstep(n, gamma)
        self.n, self.gamma = n, gamma
        self._pending: deque[dict] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, transition: dict) -> list[dict]:
        if self.n == 1:  # (every step is an item at once: no window to keep)
            return [_nstep_item(transition, transition, float(transition["reward"]), 1, self.gamma)]
        self._pending.append(transition)
        if _ends_episode(transition):
            return self.flush()
        if len(self._pending) == self.n:
            item = self._emit_oldest()
            return [item]
        return []

    def pending(self) -> list[dict]:
        """The steps whose items are not complete yet (oldest first)."""
        return list(self._pending)

    def flush(self) -> list[dict]:
        """Emit every pending item (windows end at the last pending step) and start afresh."""
        items = []
        while self._pending:
            items.append(self._emit_oldest())
        return items

    def _emit_oldest(self) -> dict:
        window = self._pending
        reward = 0.0
        for k, step in enumerate(window):
            reward += self.gamma**k * float(step["reward"])
        item = _nstep_item(window[0], window[-1], reward, len(window), self.gamma)
        window.popleft()
        return item
