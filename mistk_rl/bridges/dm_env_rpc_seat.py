"""One seat of a PettingZoo game against a fixed opponent, as a single-agent gymnasium env:
what a dm_env_rpc server serves for a game (`mistk-rl serve dm-env-rpc --env
classic/tictactoe-v3 --opponent random`).

The opponents (`mistk_rl.games.opponents`) play every other seat; a step is this seat's move
and then theirs, until it is this seat's turn again or the game is over, and its reward is
what this seat collected meanwhile (the game orchestrator's transition, from one decision to
the next). The legal moves travel in ``info["action_mask"]``, as gymnasium envs such as Taxi
put them; an illegal move loses the game at once (`GameCopy.act`).
"""

from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import numpy as np

from mistk_rl.games.opponents import OPPONENTS, UniformOpponent
from mistk_rl.games.pettingzoo_games import Decision, make_copy, resolve_id, seat_spaces


class SeatEnv(gym.Env):
    def __init__(
        self,
        game_id: str,
        opponent: str = "random",
        seat: Optional[str] = None,
        kwargs: Optional[dict[str, Any]] = None,
    ) -> None:
        api, registry_id = resolve_id(game_id)
        self.game = make_copy(api, registry_id, kwargs or {})
        spaces = seat_spaces(self.game.env)
        self.seat = seat or self.game.seats[0]
        if self.seat not in spaces:
            raise ValueError(f"{registry_id} has seats {', '.join(spaces)}, not {self.seat!r}")
        self.observation_space, self.action_space = spaces[self.seat]
        kind = OPPONENTS[opponent]
        self.opponents: dict[str, UniformOpponent] = {
            s: kind(*spaces[s]) for s in self.game.seats if s != self.seat
        }
        self._rng = np.random.default_rng()
        self._replies: dict[str, int] = {}  # the opponents' moves of the round this seat is in
        self._mine: Optional[Decision] = None

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.game.reset(seed)
        obs, mask, _, _ = self._until_my_turn()
        return obs, self._info(mask)

    def step(self, action: Any):
        self.game.act({self.seat: action, **self._replies})
        obs, mask, reward, over = self._until_my_turn()
        terminated = over and self.game.terminated
        return obs, reward, terminated, over and not terminated, self._info(mask)

    def _until_my_turn(self) -> tuple[np.ndarray, Optional[np.ndarray], float, bool]:
        """Play the opponents' moves until this seat must move or the game is over:
        (observation, mask, this seat's reward meanwhile, over)."""
        reward, last = 0.0, self._mine
        while True:
            outcomes, decisions = self.game.advance()
            for outcome in outcomes:
                if outcome.seat == self.seat:
                    reward += outcome.reward
                    last = Decision(self.seat, outcome.obs, outcome.mask)
            if not decisions:
                assert last is not None  # (a game ends with every seat's outcome)
                return last.obs, last.mask, reward, True
            replies = {d.seat: self._reply(d) for d in decisions if d.seat != self.seat}
            mine = [d for d in decisions if d.seat == self.seat]
            if not mine:
                self.game.act(replies)
                continue
            self._replies, self._mine = replies, mine[0]
            return mine[0].obs, mine[0].mask, reward, False

    def _reply(self, decision: Decision) -> int:
        masks = None if decision.mask is None else decision.mask[None]
        return int(self.opponents[decision.seat].act(decision.obs[None], masks, self._rng)[0])

    @staticmethod
    def _info(mask: Optional[np.ndarray]) -> dict[str, Any]:
        return {} if mask is None else {"action_mask": np.asarray(mask, dtype=np.int8)}

    def close(self) -> None:
        self.game.env.close()
