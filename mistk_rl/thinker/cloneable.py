"""`clone_state()` / `restore_state(s)` for envs that lack them, so the perfect model can run.

The perfect model (wrapper_type 2) restores a node's state and steps it; any state it does not
capture makes imagined steps drift from real ones (openai/gym #2163: Atari's clone misses RNG
state). So a snapshot holds the unwrapped env's state *and* the step counters of the
TimeLimit wrappers on top, and a wrapper this module knows nothing about is refused rather
than guessed at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

if TYPE_CHECKING:
    from typing_extensions import TypeIs


class CartPoleState(NamedTuple):
    state: tuple[float, ...]  # float64 (x, x_dot, theta, theta_dot)
    steps_beyond_terminated: int | None


def _clone_cartpole(env: CartPoleEnv) -> CartPoleState:
    if env.state is None:
        raise RuntimeError("call reset() before clone_state()")
    return CartPoleState(tuple(float(v) for v in env.state), env.steps_beyond_terminated)


def _restore_cartpole(env: CartPoleEnv, s: CartPoleState) -> None:
    env.state = np.array(s.state, dtype=np.float64)
    # (gymnasium's attribute is inferred from its first value, None: it holds an int too)
    env.steps_beyond_terminated = s.steps_beyond_terminated  # type: ignore[assignment]


# Per unwrapped class: (clone, restore). CartPole's step reads only these and draws no RNG.
STRATEGIES: dict[type, tuple[Callable[[Any], Any], Callable[[Any, Any], None]]] = {
    CartPoleEnv: (_clone_cartpole, _restore_cartpole),
}

# Wrappers whose state is captured (TimeLimit) or cannot change what step returns once the
# env has been reset (OrderEnforcing, PassiveEnvChecker): what gym.make puts around an env.
KNOWN_WRAPPERS = (TimeLimit, OrderEnforcing, PassiveEnvChecker)


class ClonedState(NamedTuple):
    env: Any  # the unwrapped env's own snapshot
    elapsed_steps: tuple[int, ...]  # TimeLimit counters, outermost first


class Snapshots(Protocol):
    """What the perfect model needs of an env besides gymnasium's API."""

    def clone_state(self) -> Any: ...
    def restore_state(self, state: Any) -> None: ...


def has_clone(obj: object) -> TypeIs[Snapshots]:
    return callable(getattr(obj, "clone_state", None)) and callable(
        getattr(obj, "restore_state", None)
    )


def _wrapper_chain(env: gym.Env) -> list[gym.Wrapper]:
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


class Cloneable(gym.Wrapper):
    """Adds `clone_state()` / `restore_state(s)` to an env made by `gym.make`.

    The unwrapped env is cloned by its own methods when it has them, else by a strategy in
    `STRATEGIES`; the TimeLimit counters come along, so truncation after a restore happens at
    the same step as it would have for real.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        base = env.unwrapped
        self._clone: Callable[[], Any]
        self._restore: Callable[[Any], None]
        if has_clone(base):
            self._clone = lambda: base.clone_state()
            self._restore = base.restore_state
        elif type(base) in STRATEGIES:
            clone, restore = STRATEGIES[type(base)]
            self._clone = lambda: clone(base)
            self._restore = lambda s: restore(base, s)
        else:
            raise ValueError(_refusal(env))
        unknown = [
            type(w).__name__ for w in _wrapper_chain(env) if not isinstance(w, KNOWN_WRAPPERS)
        ]
        if unknown:
            raise ValueError(
                f"cannot clone the state of wrapper(s) {unknown} around {env}: "
                "the perfect model (wrapper_type 2) needs every step-affecting "
                "state captured; give the outermost env clone_state()/"
                "restore_state()"
            )
        self._time_limits = [w for w in _wrapper_chain(env) if isinstance(w, TimeLimit)]

    # (TimeLimit's counter is inferred from its first value, None: it holds an int once reset)
    def clone_state(self) -> ClonedState:
        counters = tuple(int(w._elapsed_steps) for w in self._time_limits)  # type: ignore[call-overload]
        return ClonedState(self._clone(), counters)

    def restore_state(self, state: ClonedState) -> None:
        self._restore(state.env)
        for w, n in zip(self._time_limits, state.elapsed_steps, strict=True):
            w._elapsed_steps = n  # type: ignore[assignment]


def _refusal(env: gym.Env) -> str:
    return (
        "the perfect model (wrapper_type 2) needs clone_state()/restore_state() to "
        f"restore an env state and step it; {env} has neither, and only "
        f"{[c.__name__ for c in STRATEGIES]} are cloned without them"
    )


def ensure_cloneable(env: gym.Env) -> gym.Env:
    """`env` itself when it has clone_state/restore_state, else `Cloneable(env)`.

    gymnasium 1.x wrappers do not forward attributes, so an env from `gym.make` whose
    unwrapped env has the methods is wrapped too: the caller always calls `env.clone_state()`.
    Raises ValueError when neither the env nor a strategy can clone it.
    """
    if has_clone(env):
        return env
    if not has_clone(env.unwrapped) and type(env.unwrapped) not in STRATEGIES:
        raise ValueError(_refusal(env))
    return Cloneable(env)
