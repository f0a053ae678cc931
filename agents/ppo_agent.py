"""PPOAgent: a PPO policy behind the agent service (GAE, clipped objective, minibatch epochs).

Hyperparameters (initialize) are the agent config; see `PolicyAgent.default_config()`:
``{"seed": 0, "train": {"n_steps": 256}, "policy": {"learn": {"epochs": 10}}}``.
"""

from agents.policy_agent import PolicyAgent
from mistk_rl.rl.policies.ppo import PPOPolicy


class PPOAgent(PolicyAgent):
    policy_cls = PPOPolicy
