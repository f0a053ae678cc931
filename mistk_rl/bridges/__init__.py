"""Bridges between the contract and other protocols: dm_env_rpc both ways, and an
orchestrator's envs as a gymnasium env for callers that drive the loop themselves."""
