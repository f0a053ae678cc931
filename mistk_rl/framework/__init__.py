"""The service framework: `AbstractAgent` and `AbstractOrchestrator`, the ``do_*`` hooks a
user implements, and `ServiceImplementation`, what both share (data dir, lifecycle, limits).
The service (`mistk_rl.service`) calls these hooks; the framework calls agents through the
SDK's client, never its transport directly."""
