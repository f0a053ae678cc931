"""SB3Agent: a trained Stable-Baselines3 model behind the agent API, to evaluate or to play.

buildModel's ``modelPath`` is a ``.zip`` written by SB3's ``model.save`` (inside the data dir,
as every model path). The agent acts with the model, greedy (``predict(deterministic=True)``)
in every episode mode, and learns nothing: what it is for is putting a policy trained
elsewhere into a game, a league's pool or an evaluation config.

Hyperparameters: ``algo`` (``dqn``, ``ppo``, ``a2c``, ``sac``, ``td3``, ``ddpg``; default:
read from the zip), ``device`` (default ``cpu``).

Action masks (the game orchestrators send them) are honoured where the model exposes what
it ranks actions by: a DQN's Q-values, or the logits of an actor-critic's categorical
policy; the best legal action is taken. A model with nothing to mask (a Box action space)
refuses masks. Registration checks the model's spaces against the orchestrator's.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
from gymnasium import spaces

from mistk_rl.errors import InvalidRequest
from mistk_rl.framework.agent import AbstractAgent, Acted, Acting
from mistk_rl.registry import suggest

ALGOS = ("dqn", "ppo", "a2c", "sac", "td3", "ddpg")


def _sb3():
    try:
        import stable_baselines3
    except ImportError as exc:
        raise ValueError("SB3Agent needs Stable-Baselines3: pip install 'mistk-rl[sb3]'") from exc
    return stable_baselines3


def algo_of(path: Path) -> str:
    """The algorithm a saved model was trained with: from its policy class's module
    (``stable_baselines3.dqn.policies`` -> ``dqn``), else, for the actor-critics that share
    one policy class, from the settings saved beside it (PPO's clip range, A2C's n_steps)."""
    from stable_baselines3.common.save_util import load_from_zip_file

    data, _, _ = load_from_zip_file(path, load_data=True, device="cpu")
    data = data or {}
    module = f"{getattr(data.get('policy_class'), '__module__', '')}."
    for algo in ALGOS:
        if f".{algo}." in module:
            return algo
    if "clip_range" in data:
        return "ppo"
    if "gae_lambda" in data:
        return "a2c"
    raise ValueError(
        f"{path.name}: cannot tell which SB3 algorithm saved it (policy class "
        f"{data.get('policy_class')!r}); give hyperparameters.algo, one of "
        f"{', '.join(ALGOS)}"
    )


class SB3Agent(AbstractAgent):
    """A Stable-Baselines3 model, greedy and frozen (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.algo: Optional[str] = None
        self.device = "cpu"
        self.model: Any = None

    def validate_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        unknown = set(hparams) - {"algo", "device", "seed"}
        if unknown:
            name = sorted(unknown)[0]
            raise InvalidRequest(
                f"hyperparameters.{name}: SB3Agent takes algo, device (and "
                f"seed){suggest(name, ['algo', 'device'])}"
            )
        algo = hparams.get("algo")
        if algo is not None and algo not in ALGOS:
            raise InvalidRequest(
                f"hyperparameters.algo: {algo!r} is not one of "
                f"{', '.join(ALGOS)}{suggest(str(algo), list(ALGOS))}"
            )

    def do_initialize(self, props: dict[str, Any], hparams: dict[str, Any]) -> None:
        self.algo, self.device = hparams.get("algo"), hparams.get("device", "cpu")

    def do_build_model(self, path: Optional[Path]) -> None:
        if path is None:
            raise ValueError(
                "SB3Agent acts with a trained model: buildModel with modelPath, "
                "a .zip that SB3's model.save wrote"
            )
        sb3 = _sb3()
        algo = self.algo or algo_of(path)
        self.model = getattr(sb3, algo.upper()).load(path, device=self.device)
        self.model.policy.set_training_mode(False)

    def validate_registration(
        self, observation_space: Optional[spaces.Space], action_space: Optional[spaces.Space]
    ) -> None:
        if self.model is None:
            raise InvalidRequest("SB3Agent has no model: buildModel with a .zip first")
        for what, ours, given in (
            ("observation", self.model.observation_space, observation_space),
            ("action", self.model.action_space, action_space),
        ):
            if given is not None and not _same_space(ours, given):
                raise InvalidRequest(
                    f"the model was trained on the {what} space {ours}; "
                    f"this orchestrator's is {given}"
                )

    def do_act(self, batch: Acting) -> Acted:
        obs = batch.obs
        if batch.action_mask is None:
            actions, _ = self.model.predict(obs, deterministic=True)
            return Acted(np.asarray(actions))
        scores = self._action_scores(obs)
        mask = np.asarray(batch.action_mask, dtype=bool).reshape(scores.shape)
        if not mask.any(axis=1).all():
            raise ValueError("action mask allows no action")
        return Acted(np.where(mask, scores, -np.inf).argmax(axis=1))

    def _action_scores(self, obs: Any) -> np.ndarray:
        """What the model ranks discrete actions by: Q-values (DQN) or policy logits."""
        import torch

        policy = self.model.policy
        if not isinstance(self.model.action_space, spaces.Discrete):
            raise ValueError(
                f"action masks: a model acting in {self.model.action_space} has "
                "no per-action scores to mask (Discrete spaces only)"
            )
        tensor, _ = policy.obs_to_tensor(obs)
        with torch.no_grad():
            if hasattr(policy, "q_net"):  # DQN
                return policy.q_net(tensor).cpu().numpy()
            distribution = policy.get_distribution(tensor).distribution
            return distribution.logits.cpu().numpy()

    def do_save_model(self, path: Path) -> None:
        if self.model is None:
            raise ValueError("SB3Agent has no model to save")
        fd, tmp = tempfile.mkstemp(suffix=".zip", dir=path.parent)
        os.close(fd)
        try:
            self.model.save(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def do_reset(self, unload_model: bool) -> None:
        if unload_model:
            self.model = None


def _same_space(a: spaces.Space, b: spaces.Space) -> bool:
    """Equal, ignoring a Box's dtype width (float32 vs float64 bounds)."""
    if isinstance(a, spaces.Box) and isinstance(b, spaces.Box):
        return (
            a.shape == b.shape
            and np.allclose(a.low, b.low, equal_nan=True)
            and np.allclose(a.high, b.high, equal_nan=True)
        )
    return a == b
