"""mistk-rl: RL agents and environment orchestrators as REST services.

The packages, by role (docs/layout.md): `sdk` (how callers talk to the services), `wire`
(the bytes between them), `framework` (the hooks an agent or orchestrator implements),
`service` (serving those over HTTP), `deploy` (starting services, locally or on Ray), and
the libraries `rl`, `games`, `league`, `thinker`."""

from mistk_rl._moved import install as _install_moved_names

__version__ = "0.1.0"
API_VERSION = "1.0.0"

_install_moved_names()  # the 0.1 module names (mistk_rl.client, ...), for one release
