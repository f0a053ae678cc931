"""Agent services for the built-in game opponents (`mistk_rl.games.opponents`): fixed,
seeded sparring partners and evaluation baselines for two-player PettingZoo classic games.

They read the board from the "observation" array of a PettingZoo classic observation (the
orchestrator sends its "action_mask" separately), so they register with that Box as their
observation space. Like RandomAgent they have no model: a "checkpoint" is their settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.files import atomic_write_json
from mistk_rl.framework.agent import AbstractAgent, Observations
from mistk_rl.framework.implementation import PROGRESS_EVERY_S
from mistk_rl.games.opponents import (
    OPPONENTS,
    ConnectFourWinBlock,
    MaskedRandom,
    TicTacToePerfect,
    UniformOpponent,
)
from mistk_rl.registry import did_you_mean


class OpponentAgent(AbstractAgent):
    """Plays any built-in opponent. Hyperparameters: ``opponent`` (a name in
    `mistk_rl.games.opponents.OPPONENTS`; the subclasses below give a default) and ``seed``
    (non-negative int or null) for reproducible choices among equally good moves."""

    opponent_cls: ClassVar[Optional[type[UniformOpponent]]] = None  # the default opponent

    def __init__(self) -> None:
        super().__init__()
        self.seed: Optional[int] = None
        self.playing: Optional[type[UniformOpponent]] = type(self).opponent_cls
        self.opponent: Optional[UniformOpponent] = None
        self.rng = np.random.default_rng()
        self.actions_taken = 0

    def validate_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        unknown = sorted(set(hparams) - {"opponent", "seed"})
        if unknown:
            raise InvalidRequest(
                f"hyperparameters: {type(self).__name__} takes only "
                f"opponent and seed, not {unknown}"
            )
        playing = OPPONENTS[self._opponent_name(hparams)]
        if playing.searches and self.steps_inline:
            raise InvalidRequest(
                f"hyperparameters.opponent: {playing.name} searches, for milliseconds or "
                "more a move: serve it with agents.opponent_agents:SearchOpponentAgent "
                "(its moves off the event loop, which keeps answering status and health)"
            )
        seed = hparams.get("seed")
        if seed is not None and (type(seed) is not int or seed < 0):
            raise InvalidRequest(
                f"hyperparameters: seed must be a non-negative int or null, not {seed!r}"
            )

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        self.seed = hparams.get("seed")
        self.playing = OPPONENTS[self._opponent_name(hparams)]

    def _opponent_name(self, hparams: dict[str, Any]) -> str:
        """The opponent `hparams` names (else the class's default); InvalidRequest when
        there is none or it names no opponent."""
        name = hparams.get("opponent", self._default_name())
        if name is None:
            raise InvalidRequest(
                f"hyperparameters: opponent is required (one of {', '.join(OPPONENTS)})"
            )
        if not isinstance(name, str) or name not in OPPONENTS:
            raise InvalidRequest(
                "hyperparameters.opponent: "
                + did_you_mean(str(name), OPPONENTS.names(), OPPONENTS.what)
            )
        return name

    def do_build_model(self, path: Optional[Path]) -> None:
        if path is not None:  # a saved opponent: restore its seed
            saved = json.loads(path.read_text())
            if saved.get("opponent") != self._opponent_cls().name:
                raise ValueError(
                    f"{path.name} is a {saved.get('agent')} file of the "
                    f"{saved.get('opponent')} opponent, not of "
                    f"{self._opponent_cls().name}"
                )
            self.seed = saved.get("seed", self.seed)
        self.actions_taken = 0

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
        if observation_space is None or action_space is None:
            raise InvalidRequest(
                f"{type(self).__name__} needs observationSpace and actionSpace at registration"
            )
        try:
            self._opponent_cls().check_spaces(observation_space, action_space)
        except ValueError as exc:
            raise InvalidRequest(
                f"{type(self).__name__} cannot play in these spaces: {exc}"
            ) from exc

    def do_agent_registered(self, config: dict[str, Any]) -> None:
        if self.observation_space is None or self.action_space is None:
            raise RuntimeError("no spaces: register the agent first")
        self.opponent = self._opponent_cls()(self.observation_space, self.action_space)
        self.rng = np.random.default_rng(self.seed)

    def do_get_action(
        self, obs: Observations, action_mask: Optional[Observations] = None
    ) -> dict[str, Any]:
        if self.opponent is None:
            raise RuntimeError("no opponent: register the agent first")
        names = list(obs)
        masks = action_mask or {}
        all_legal = np.ones(self.opponent.n, dtype=np.int8)
        actions = self.opponent.act(
            np.stack([np.asarray(obs[n]) for n in names]),
            np.stack([np.asarray(masks.get(n, all_legal)) for n in names]),
            self.rng,
        )
        self.actions_taken += len(names)
        # (throttled: a game asks hundreds of times a second, each update wakes long-polls)
        self.update_status({"actionsTaken": self.actions_taken}, every_s=PROGRESS_EVERY_S)
        return dict(zip(names, actions.tolist()))

    def do_save_model(self, path: Path) -> None:
        atomic_write_json(
            path,
            {
                "agent": type(self).__name__,
                "opponent": self._opponent_cls().name,
                "seed": self.seed,
                "actionsTaken": self.actions_taken,
            },
        )

    def _default_name(self) -> Optional[str]:
        default = type(self).opponent_cls
        return None if default is None else default.name

    def _opponent_cls(self) -> type[UniformOpponent]:
        if self.playing is None:
            raise RuntimeError("no opponent: initialize the agent with one first")
        return self.playing


class SearchOpponentAgent(OpponentAgent):
    """`OpponentAgent` for any opponent, the searchers too (alpha-beta, Monte-Carlo tree
    search: `mistk_rl.games.search`): its moves are computed on the service's thread pool,
    not on its event loop, so a search of a tenth of a second a move holds no other
    request (it offers no step stream, whose frames are answered on the event loop)."""

    steps_inline = False


class MaskedRandomAgent(OpponentAgent):
    """Any legal move, for any Discrete action space (RandomAgent also covers other spaces)."""

    opponent_cls = MaskedRandom


class TicTacToePerfectAgent(OpponentAgent):
    """Perfect tic-tac-toe: never loses."""

    opponent_cls = TicTacToePerfect


class ConnectFourWinBlockAgent(OpponentAgent):
    """Connect four: takes an immediate win, else blocks one, else plays at random."""

    opponent_cls = ConnectFourWinBlock
