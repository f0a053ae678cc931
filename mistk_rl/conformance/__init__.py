"""The conformance kit: checks any agent or orchestrator service, in any language, against
the contract (the OpenAPI specs and the lifecycle tables), and says what failed and why."""
