"""The RL library behind the agent services: config, models and wrappers, policies, data
(buffers, collate, n-step, GAE), learner and evaluator."""
