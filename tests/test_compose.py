"""The compose file wires an agent, an orchestrator and a harness that can actually meet."""
from __future__ import annotations

import yaml

from harness.config import load_config
from mistk_rl.service.server import import_implementation
from tests.conftest import REPO


def test_compose_services_point_at_real_classes_and_config():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"agent", "orchestrator", "harness"} <= set(services)
    for name in ("agent", "orchestrator"):
        command = services[name]["command"]
        assert command[:2] == ["serve", name]
        import_implementation(name, command[2])  # the class exists and has the right base
        assert "--host" in command  # inside the compose network it must not bind loopback
    orch_command = services["orchestrator"]["command"]
    allowed = orch_command[orch_command.index("--allow-agent-host") + 1]
    config = load_config(REPO / services["harness"]["command"][1])
    assert config.agents[0].url.startswith(f"http://{allowed}:")
    assert services["harness"]["depends_on"]["agent"]["condition"] == "service_healthy"
