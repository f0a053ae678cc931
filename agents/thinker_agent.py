"""ThinkerPPOAgent: PPO with the tree-reading actor-critic, for the Thinker MDP.

Registered with a Thinker orchestrator's spaces (observation ``{"tree_reps", "real_states"}``,
action Discrete(2A)), it learns imagination and real moves alike from the real reward, with
a model that reads each action's tree statistics through one shared readout
(`mistk_rl.thinker.actor_critic`). Hyperparameters are PPOAgent's; the model section adds
``readout_hidden`` and ``reset_logit`` and has no ``share_encoder`` or ``log_std_init``.
configs/puzzle_thinker_agent.yaml plays the puzzle with it.
"""

from agents.policy_agent import PolicyAgent
from mistk_rl.thinker.policy import ThinkerPPOPolicy


class ThinkerPPOAgent(PolicyAgent):
    policy_cls = ThinkerPPOPolicy
