"""PPOAgent: a PPO policy behind the agent service (GAE, clipped objective, minibatch epochs).

Hyperparameters (initialize) are the agent config; see `PolicyAgent.default_config()`:
``{"seed": 0, "train": {"n_steps": 256}, "policy": {"learn": {"epochs": 10}}}``.
"""
from mistk_rl.rl.policies.ppo import PPOPolicy
from agents.policy_agent import PolicyAgent


class PPOAgent(PolicyAgent):
    policy_cls = PPOPolicy
