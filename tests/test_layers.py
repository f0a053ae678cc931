"""The folders are the layers (docs/layout.md): the import contracts in setup.cfg hold, no
module imports another module's private names, and there is no import cycle at all."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
TOPS = ("mistk_rl", "agents", "orchestrators", "harness")


def test_import_contracts_hold():
    """`lint-imports` on setup.cfg's contracts (layers point down; the run driver knows
    neither the CLI nor the benches; no cycles between sibling packages)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(no_cache=True, no_logo=True))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_no_module_import_cycle():
    """No cycle between any two modules, through any chain, function-level and
    TYPE_CHECKING imports included (a package's __init__ re-exporting its children is not a
    cycle: the children never import their package's __init__ here)."""
    sys.path.insert(0, str(REPO))
    try:
        graph = grimp.build_graph(*TOPS, cache_dir=None)
    finally:
        sys.path.remove(str(REPO))
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(imports) == []


def test_no_private_names_imported_across_modules():
    """`from module import _name` reaches into another module's internals: make it public
    (and documented) in its owner, or move it."""
    reaching = []
    for top in TOPS:
        for path in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    reaching += [
                        f"{path.relative_to(REPO)}: from {node.module} import {alias.name}"
                        for alias in node.names
                        if alias.name.startswith("_") and not alias.name.startswith("__")
                    ]
    assert reaching == []


def test_services_and_callers_that_run_no_model_do_not_load_torch():
    """torch takes seconds to import: the SDK, the serving pipeline, the step path and the
    gym orchestrator must not load it (a policy copy loads it where one runs)."""
    modules = (
        "mistk_rl.sdk.client",
        "mistk_rl.service.app",
        "mistk_rl.sdk.stepping",
        "orchestrators.gym_orchestrator",
        "agents.random_agent",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; import {', '.join(modules)}; print('torch' in sys.modules)",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
