"""The modules that moved into role packages (0.2: `sdk/`, `wire/`, `framework/`, `deploy/`),
still importable by their old names for one release, with a DeprecationWarning.

``import mistk_rl.client`` gives a stand-in module that forwards every attribute to
`mistk_rl.sdk.client`, so ``from mistk_rl.client import AgentClient`` is the same class as
before, and a pickle that names an old path still loads. The stand-in is a module of its own
(not the new module under a second name): importlib would otherwise overwrite the new
module's ``__spec__`` with the old name's. A meta-path finder, not a file per old name: the
top level keeps only the modules that live there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Callable, Optional, Sequence

MOVED: dict[str, str] = {
    "mistk_rl.client": "mistk_rl.sdk.client",
    "mistk_rl.transport": "mistk_rl.sdk.transport",
    "mistk_rl.stepping": "mistk_rl.sdk.stepping",
    "mistk_rl.served_policy": "mistk_rl.sdk.served_policy",
    "mistk_rl.schemas": "mistk_rl.sdk.schemas",
    "mistk_rl.codec": "mistk_rl.wire.codec",
    "mistk_rl.frames": "mistk_rl.wire.frames",
    "mistk_rl.jsonable": "mistk_rl.wire.jsonable",
    "mistk_rl.agent": "mistk_rl.framework.agent",
    "mistk_rl.orchestrator": "mistk_rl.framework.orchestrator",
    "mistk_rl.implementation": "mistk_rl.framework.implementation",
    "mistk_rl.launch": "mistk_rl.deploy.launch",
    "mistk_rl.cluster": "mistk_rl.deploy.cluster",
    "mistk_rl.ray_address": "mistk_rl.rl.envs.ray_address",
}


class _Forward(types.ModuleType):
    """An old module name: every attribute read comes from the module it moved to."""

    def __init__(self, old: str, new: types.ModuleType) -> None:
        super().__init__(old, f"moved to {new.__name__}")
        self.__dict__["_target"] = new

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_target"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_target"])


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        # (stacklevel 2: the line with the old import; warnings skips importlib's own frames)
        warnings.warn(
            f"{spec.name} moved to {new}: import it from there (the old name goes "
            "in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return _Forward(spec.name, importlib.import_module(new))

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the stand-in forwards to a module imported already."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Optional[Sequence[str]],
        target: Optional[types.ModuleType] = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _LOADER)


_LOADER = _MovedLoader()


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (after the standard finders: a real module
    of an old name, should one come back, wins)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


def renamed(module: str, names: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the names `module` renamed in 0.2 (old -> new): the old
    name gives the new object, with a DeprecationWarning, for one release."""

    def __getattr__(name: str) -> Any:
        if name in names:
            warnings.warn(
                f"{module}.{name} is now {names[name]} (the old name goes in the next release)",
                DeprecationWarning,
                stacklevel=2,
            )
            return namespace[names[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
