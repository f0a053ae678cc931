"""The OpenAPI contracts (agent.yaml, orchestrator.yaml), shipped as package data."""
