"""DQNAgent: a DQN policy behind the agent service (double, dueling, n-step, PER: all config).

Hyperparameters (initialize) are the agent config; see `PolicyAgent.default_config()`:
``{"seed": 0, "policy": {"learn": {"lr": 1e-3}}, "buffer": {"type": "advanced"}}``.
"""

from agents.policy_agent import PolicyAgent
from mistk_rl.rl.policies.dqn import DQNPolicy


class DQNAgent(PolicyAgent):
    policy_cls = DQNPolicy
