"""The wire: how bytes look between the SDK and the services, shared by both sides.
`codec` (the binary tensor encoding), `frames` (the step stream's framing), `jsonable`
(JSON of numpy values), `columns` (a batch of env copies as columns), `spin` (the
awake-wait both sides share). It imports nothing of the project above `errors`."""
