"""The 0.1 module names (`mistk_rl.client`, ...) still import, for one release, with a
DeprecationWarning, and give the very objects of the modules they moved to."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import warnings

import pytest

from mistk_rl._moved import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_name_warns_and_forwards_to_the_new_module(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        stand_in = importlib.import_module(old)
    target = importlib.import_module(new)
    public = [name for name in vars(target) if not name.startswith("_")]
    assert public and all(getattr(stand_in, name) is getattr(target, name) for name in public)
    assert set(public) <= set(dir(stand_in))
    assert target.__spec__.name == new  # (the new module is left as it was)


def test_the_users_import_of_0_1_works():
    sys.modules.pop("mistk_rl.client", None)
    with pytest.warns(DeprecationWarning) as caught:
        from mistk_rl.client import AgentClient
    from mistk_rl.sdk.client import AgentClient as moved

    assert AgentClient is moved
    assert caught[0].filename == __file__  # the warning names the line with the old import


def test_a_pickle_naming_an_old_path_loads():
    """A checkpoint or result pickled by 0.1 names its classes by the old module paths."""
    from mistk_rl.framework.agent import EpisodeInfo

    old = pickle.dumps(EpisodeInfo, protocol=0).replace(
        b"mistk_rl.framework.agent", b"mistk_rl.agent"
    )
    assert b"mistk_rl.agent" in old
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert pickle.loads(old) is EpisodeInfo


def test_the_new_names_import_without_a_warning():
    """The package itself uses no old name: importing every new module warns of none."""
    modules = sorted(set(MOVED.values()) | {"mistk_rl.service.server", "harness.cli"})
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::DeprecationWarning:mistk_rl._moved",
            "-c",
            f"import {', '.join(modules)}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_name_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mistk_rl.no_such_module")


@pytest.mark.parametrize(
    "module, old, new",
    [
        ("mistk_rl.errors", "NotFound", "ResourceNotFound"),
        ("mistk_rl.sdk.stepping", "Outcome", "StepOutcome"),
        ("mistk_rl.framework.agent", "PolicyCopy", "PolicyDescription"),
        ("mistk_rl.rl.config", "ConfigError", "AgentConfigError"),
        ("harness.config", "ConfigError", "RunConfigError"),
    ],
)
def test_a_renamed_name_warns_and_gives_the_new_object(module, old, new):
    """Names that collided with another's (two `Outcome`s, two `ConfigError`s, ...) were
    renamed to say what they are; 0.1's name still gives the object, with a warning."""
    namespace = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is now {new}"):
        assert getattr(namespace, old) is getattr(namespace, new)
    with pytest.raises(AttributeError, match="no attribute 'Nonesuch'"):
        namespace.Nonesuch  # noqa: B018


def test_no_public_class_name_is_defined_twice():
    """A class name says what it is once in the package: no two modules define the same."""
    import ast
    from collections import defaultdict
    from pathlib import Path

    where = defaultdict(list)
    root = Path(__file__).resolve().parents[1]
    for top in ("mistk_rl", "agents", "orchestrators", "harness"):
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(str(path.relative_to(root)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
