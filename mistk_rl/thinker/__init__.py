"""The Thinker-augmented MDP (Chung et al., 2023; the seed's v1.1 API): `make` builds a batched
env whose agent plans in a search tree before each real step. See `env.py` for the stage
rules, `tree.py` for the statistics, `config.py` for the settings."""

from mistk_rl.thinker import puzzle  # noqa: F401 - registers MistkPuzzle-v0 with gymnasium
from mistk_rl.thinker.config import ThinkerConfig, load_config
from mistk_rl.thinker.env import ThinkerEnv, make
from mistk_rl.thinker.tree import decode_tree_reps

__all__ = ["ThinkerConfig", "ThinkerEnv", "decode_tree_reps", "load_config", "make"]
