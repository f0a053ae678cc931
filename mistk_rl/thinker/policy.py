"""PPO on the Thinker MDP: `mistk_rl.rl.policies.ppo.PPOPolicy` with the tree-reading
actor-critic (`mistk_rl.thinker.actor_critic`). Everything else (GAE, the clipped objective,
pacing, checkpoints) is PPO's; a stage's K steps discount by gamma ** (1/K) each when the
config says so (see configs/puzzle_thinker_agent.yaml)."""

from __future__ import annotations

from gymnasium import spaces

from mistk_rl.rl.models import ActorCriticModel
from mistk_rl.rl.policies.ppo import PPOPolicy
from mistk_rl.thinker.actor_critic import ThinkerActorCritic


class ThinkerPPOPolicy(PPOPolicy):
    action_spaces = (spaces.Discrete,)

    @classmethod
    def default_config(cls) -> dict:
        config = super().default_config()
        # PPO's share_encoder and log_std_init mean nothing here (the critic has its own
        # trunk; the actions are discrete): setting one is an error that names it
        for key in ("share_encoder", "log_std_init"):
            del config["model"][key]
        # reset_logit: the reset half's starting logit. At 0 an agent 50k real steps in
        # still reset on half its imaginary steps: its walks reached depth 3.3 of L = 5 and
        # found a solution half as often as the scripted planner's, which never resets by
        # choice. -2 starts it at 12%; learning moves it from there (about 25% at 100k)
        config["model"].update(hidden_sizes=[128, 128], readout_hidden=32, reset_logit=-2.0)
        return config

    def _build_model(self, model: dict) -> ActorCriticModel:
        return ThinkerActorCritic(
            self.observation_space,
            self.action_n,
            hidden_sizes=tuple(model["hidden_sizes"]),
            activation=model["activation"],
            encoder=model["encoder"],
            readout_hidden=model["readout_hidden"],
            reset_logit=model["reset_logit"],
        )
