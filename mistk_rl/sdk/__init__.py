"""The SDK: how a caller talks to the services. `client` (AgentClient, OrchestratorClient,
ColumnPipeline), `transport` (its keep-alive HTTP and the step stream), `stepping` (an
orchestrator's side of the step path: over HTTP, the stream, or local inference),
`served_policy` (a served agent as a policy object) and `schemas` (the typed bodies).
It imports the wire, the foundation and the RL library below it, never the service."""
