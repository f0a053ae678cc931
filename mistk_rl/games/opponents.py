"""Built-in opponents for two-player games: fixed rules that pick uniformly among the replies
they allow, so they are reproducible from a seed and their strength is exactly computable;
and searchers that are strong without learning (`mistk_rl.games.search`): alpha-beta, whose
best moves are such a set, and Monte-Carlo tree search, which draws its move by chance."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Optional, Protocol

import numpy as np
from gymnasium import spaces

from mistk_rl.games import connect_four, tictactoe
from mistk_rl.games.search import Rules, alphabeta_moves, mcts_move
from mistk_rl.registry import Registry

# every UniformOpponent subclass with a `name` is one (declared by writing the class): the
# spec's enums, exhaustive evaluations, the opponent agents and result labels read this
OPPONENTS: Registry[type["UniformOpponent"]] = Registry("opponents", "built-in opponent")


class Opponent(Protocol):
    @property
    def name(self) -> str:
        """The opponent's registered name; read-only, so a class attribute satisfies it."""

    def replies(self, obs: np.ndarray, mask: Optional[np.ndarray]) -> list[int]:
        """The moves this opponent chooses among, uniformly, in this position."""

    def act(
        self, obs: np.ndarray, masks: Optional[np.ndarray], rng: np.random.Generator
    ) -> np.ndarray:
        """One move per row of a batch (obs [B, ...], masks [B, n]), uniform among replies."""


class UniformOpponent(ABC):
    """Samples uniformly among `replies`. Subclasses declare the spaces they play in:
    `obs_shape` (a Box of that shape; None: any observation space) and `n_actions`
    (Discrete(n_actions); None: any Discrete)."""

    name: ClassVar[str]
    label: ClassVar[str]  # short, for result names: vs_<label>
    obs_shape: ClassVar[Optional[tuple[int, ...]]] = None
    n_actions: ClassVar[Optional[int]] = None
    enumerable: ClassVar[bool] = True  # its replies are the moves it plays (exhaustive runs)
    searches: ClassVar[bool] = False  # takes ms or more a move (served off the event loop)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            OPPONENTS.add(cls.name, cls)

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        self.check_spaces(observation_space, action_space)
        self.n = int(action_space.n)  # type: ignore[attr-defined]  # (Discrete: checked)

    @classmethod
    def check_spaces(cls, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        """Raise ValueError, saying why, unless this opponent can play in these spaces."""
        expected = "Discrete" if cls.n_actions is None else f"Discrete({cls.n_actions})"
        if not (isinstance(action_space, spaces.Discrete) and action_space.start == 0) or (
            cls.n_actions is not None and action_space.n != cls.n_actions
        ):
            raise ValueError(
                f"{cls.name} plays actions in {expected} starting at 0, not {action_space}"
            )
        if cls.obs_shape is not None and not (
            isinstance(observation_space, spaces.Box) and observation_space.shape == cls.obs_shape
        ):
            raise ValueError(
                f"{cls.name} reads observations of a Box of shape "
                f"{cls.obs_shape}, not {observation_space}"
            )

    @abstractmethod
    def replies(self, obs: np.ndarray, mask: Optional[np.ndarray]) -> list[int]:
        """See `Opponent.replies`."""

    def act(
        self, obs: np.ndarray, masks: Optional[np.ndarray], rng: np.random.Generator
    ) -> np.ndarray:
        """See `Opponent.act`."""
        actions = np.empty(len(obs), dtype=np.int64)
        for row, board in enumerate(obs):
            move = self.move(board, None if masks is None else masks[row], rng)
            if move is None:
                raise ValueError(
                    f"{self.name}: no move to choose from in row {row} "
                    "(an all-zero mask, or a finished game)"
                )
            actions[row] = move
        return actions

    def move(
        self, obs: np.ndarray, mask: Optional[np.ndarray], rng: np.random.Generator
    ) -> Optional[int]:
        """One position's move: uniform among `replies`; None when there is none."""
        moves = self.replies(obs, mask)
        return moves[rng.integers(len(moves))] if moves else None


class MaskedRandom(UniformOpponent):
    """Any legal move: those the mask allows, or every action without one."""

    name = label = "random"

    def replies(self, obs: np.ndarray, mask: Optional[np.ndarray]) -> list[int]:
        if mask is None:
            return list(range(self.n))
        return np.flatnonzero(np.asarray(mask).reshape(self.n)).tolist()


class TicTacToePerfect(UniformOpponent):
    """Never loses: any move that keeps the minimax value (the mask is implied by the board)."""

    name, label = "tictactoe_perfect", "perfect"
    obs_shape, n_actions = (3, 3, 2), tictactoe.CELLS

    def replies(self, obs: np.ndarray, mask: Optional[np.ndarray]) -> list[int]:
        return tictactoe.optimal_moves(obs)


class ConnectFourWinBlock(UniformOpponent):
    """Wins when it can, blocks an immediate threat, else plays any legal column."""

    name, label = "connect4_winblock", "winblock"
    obs_shape, n_actions = (connect_four.ROWS, connect_four.COLS, 2), connect_four.COLS

    def replies(self, obs: np.ndarray, mask: Optional[np.ndarray]) -> list[int]:
        return connect_four.winblock_moves(obs, mask)


# ---- searchers --------------------------------------------------------------------------------
class _Searcher(UniformOpponent):
    """A searcher of one game (a game's mixin gives them): its `rules`, and `position`,
    which reads an observation into the rules' (own, other) masks."""

    rules: ClassVar[Rules]
    searches = True

    @abstractmethod
    def position(self, obs: np.ndarray) -> tuple[int, int]: ...

    def _open(self, obs: np.ndarray) -> Optional[tuple[int, int]]:
        own, other = self.position(obs)
        rules = self.rules
        if rules.won(own) or rules.won(other) or not rules.moves(own, other):
            return None
        return own, other


class AlphaBeta(_Searcher):
    """Any move that alpha-beta search `depth` plies deep rates best, ties drawn uniformly:
    it never misses a win in one, and from depth 2 never leaves a win in one it could block.
    (The mask is implied by the board.)"""

    depth: ClassVar[int]

    def replies(self, obs: np.ndarray, mask: Optional[np.ndarray]) -> list[int]:
        position = self._open(obs)
        if position is None:
            return []
        return alphabeta_moves(self.rules, *position, self.depth)


class MonteCarlo(_Searcher):
    """Monte-Carlo tree search (UCT) with random rollouts, `simulations` a move, its chance
    drawn from the generator it is given (the opponent agent's, seeded): a stronger player
    the more it simulates, and never the same in every game. Not enumerable."""

    simulations: ClassVar[int]
    enumerable = False

    def replies(self, obs: np.ndarray, mask: Optional[np.ndarray]) -> list[int]:
        raise TypeError(f"{self.name} draws its move by chance: it has no set of replies")

    def move(
        self, obs: np.ndarray, mask: Optional[np.ndarray], rng: np.random.Generator
    ) -> Optional[int]:
        position = self._open(obs)
        return None if position is None else mcts_move(self.rules, *position, self.simulations, rng)


class _TicTacToe:
    """What a tic-tac-toe searcher reads and plays (mixed in before the search)."""

    obs_shape: ClassVar[Optional[tuple[int, ...]]] = (3, 3, 2)
    n_actions: ClassVar[Optional[int]] = tictactoe.CELLS
    rules: ClassVar[Rules] = tictactoe.TicTacToeRules()

    def position(self, obs: np.ndarray) -> tuple[int, int]:
        return tictactoe.board_key(obs)


class _ConnectFour:
    """What a connect-four searcher reads and plays (mixed in before the search)."""

    obs_shape: ClassVar[Optional[tuple[int, ...]]] = (connect_four.ROWS, connect_four.COLS, 2)
    n_actions: ClassVar[Optional[int]] = connect_four.COLS
    rules: ClassVar[Rules] = connect_four.ConnectFourRules()

    def position(self, obs: np.ndarray) -> tuple[int, int]:
        return connect_four.bitboards(obs)


# (game, search, name, label, strength): each row declares (and so registers) one opponent
SEARCHERS = (
    (_TicTacToe, AlphaBeta, "tictactoe_alphabeta2", "ab2", {"depth": 2}),
    (_TicTacToe, MonteCarlo, "tictactoe_mcts25", "mcts25", {"simulations": 25}),
    (_TicTacToe, MonteCarlo, "tictactoe_mcts100", "mcts100", {"simulations": 100}),
    (_TicTacToe, MonteCarlo, "tictactoe_mcts400", "mcts400", {"simulations": 400}),
    (_ConnectFour, AlphaBeta, "connect4_alphabeta2", "ab2", {"depth": 2}),
    (_ConnectFour, AlphaBeta, "connect4_alphabeta4", "ab4", {"depth": 4}),
    (_ConnectFour, MonteCarlo, "connect4_mcts50", "mcts50", {"simulations": 50}),
    (_ConnectFour, MonteCarlo, "connect4_mcts200", "mcts200", {"simulations": 200}),
    (_ConnectFour, MonteCarlo, "connect4_mcts800", "mcts800", {"simulations": 800}),
)
for _game, _search, _name, _label, _strength in SEARCHERS:
    type(_name, (_game, _search), {"name": _name, "label": _label, **_strength})
