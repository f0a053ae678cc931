"""The documentation site builds with `mkdocs build --strict` (a broken link, a missing page
or a docstring mkdocstrings cannot read fails it), and its generated pages cover what they
claim: every operation of both contracts, every key of the harness config, every state a
caller sees in the lifecycle pictures, the SDK's clients."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config import RunConfig
from mistk_rl.lifecycle.diagram import caller_edges
from mistk_rl.lifecycle.tables import AGENT, ORCHESTRATOR

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "mistk_rl" / "openapi"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_http_api_page_has_every_operation_of_both_contracts(site: Path) -> None:
    page = (site / "reference" / "http-api" / "index.html").read_text()
    for name in ("agent.yaml", "orchestrator.yaml"):
        spec = yaml.safe_load((SPECS / name).read_text())
        for methods in spec["paths"].values():
            for op in methods.values():
                assert f'id="{op["operationId"].lower()}"' in page, op["operationId"]
        for schema in spec["components"]["schemas"]:
            assert f'id="{schema.lower()}"' in page, schema


def test_the_configs_page_has_every_key_with_its_default(site: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (site / "reference" / "configs" / "index.html").read_text()
    rows = hooks.config_rows(RunConfig)
    keys = {key for key, _, _, _ in rows}
    # nested models are walked: a key of a list of models and one of a nested model
    assert {
        "training.env_steps",
        "agents[].local_inference.batch_steps",
        "game_training.stop_when[].min_win",
        "timeouts.startup",
    } <= keys
    for key, *_ in rows:
        assert f"<code>{key}</code>" in page, key
    assert ("training.eval_every", "int", "`5000`") in {row[:3] for row in rows}
    # the agents' hyperparameters, with their defaults
    assert "batch_size" in page and "hidden_sizes" in page and "model_unroll_len" in page
    assert "ThinkerPPOAgent" in page and "reset_logit" in page


def test_the_lifecycle_pictures_show_every_state_a_caller_sees(site: Path) -> None:
    for table in (AGENT, ORCHESTRATOR):
        picture = (site / "concepts" / f"{table.role}-lifecycle.svg").read_text()
        states, edges = caller_edges(table)
        for state in states:
            assert f">{state}<" in picture, (table.role, state)
        for _, _, label in edges:
            for line in label.splitlines():
                assert f">{line.replace('>', '&gt;')}<" in picture, (table.role, line)
    page = (site / "concepts" / "index.html").read_text()
    assert "agent-lifecycle.svg" in page and "orchestrator-lifecycle.svg" in page


def test_the_sdk_page_documents_the_clients(site: Path) -> None:
    page = (site / "reference" / "sdk" / "index.html").read_text()
    for name in (
        "mistk_rl.sdk.client.AgentClient.get_action",
        "mistk_rl.sdk.client.OrchestratorClient.start_episode",
        "mistk_rl.sdk.served_policy.ServedPolicy.predict",
        "mistk_rl.sdk.client.WaitTimeout",
    ):
        assert f'id="{name}"' in page, name


def test_every_operation_of_a_table_is_an_edge_of_the_callers_view() -> None:
    """Folding busy states away loses no operation: each row entering a busy state is an
    edge from its source, whichever resting state its hook finishes in."""
    for table in (AGENT, ORCHESTRATOR):
        _, edges = caller_edges(table)
        drawn = {
            (source, line.split("\n")[0].split(" ")[0])
            for source, _, label in edges
            for line in label.splitlines()
        }
        for row in table.transitions:
            if row["trigger"] in ("finish", "fail", "reset", "terminate"):
                continue
            sources = [row["source"]] if isinstance(row["source"], str) else row["source"]
            for source in sources:
                assert (source, row["trigger"]) in drawn, (table.role, source, row["trigger"])
    _, edges = caller_edges(AGENT)
    assert ("started", "initialized", "initialize") in edges
    assert ("any state", "initialized", "reset\n[keep_model]") in edges


def test_the_quickstart_gives_the_readmes_two_commands() -> None:
    """The README is the short entry point; the site's quickstart must not drift from it."""
    import re

    readme = (ROOT / "README.md").read_text()
    two = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", two, flags=re.S)
    assert len(commands) == 2
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    for command in commands:
        assert command in quickstart
