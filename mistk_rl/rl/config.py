"""Config trees: every component's defaults, merged with what the user wrote.

Each component (policy, buffer, trainer, ...) declares `default_config()`; an agent stacks
them into one tree and `deep_merge` merges the user's config over it, as DI-engine does (and
each component merges its own section again when built on its own). It is the one merge
here: the Thinker's settings go through it too. Unlike DI-engine it is strict: a key that is
not in the defaults is a typo until proven otherwise, so it is an error that names the key's
full path and suggests the closest valid key. A default of `{}` marks an *open* mapping
(model kwargs, env kwargs) that accepts any keys.
"""

from __future__ import annotations

import copy
import json
import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mistk_rl._moved import renamed
from mistk_rl.files import atomic_write_bytes
from mistk_rl.registry import suggest


class AgentConfigError(ValueError):
    """The user's config does not fit the defaults: unknown key or wrong type."""


def deep_merge(defaults: Mapping, user: Mapping | None, *, path: str = "") -> dict:
    """A new tree: `defaults` with `user` merged over it (inputs are never mutated).

    Mappings merge key by key; any other value replaces the default. A key that `defaults`
    lacks is a AgentConfigError naming its dotted path, unless `defaults` is `{}` (open: any keys).
    Bool and number defaults are type-checked. `path` locates this level in error messages.
    """
    merged = copy.deepcopy(dict(defaults))
    if user is None:  # an empty YAML section (`model:`) means "keep the defaults"
        return merged
    if not isinstance(user, Mapping):
        raise AgentConfigError(
            f"{path or 'config'}: expected a mapping, got {type(user).__name__} ({user!r})"
        )
    is_open = not defaults
    for key, value in user.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key in defaults:
            merged[key] = _merge_value(defaults[key], value, key_path)
        elif is_open:
            merged[key] = copy.deepcopy(value)
        else:
            raise AgentConfigError(_unknown_key_message(key, path, defaults))
    return merged


def _merge_value(default: Any, value: Any, path: str) -> Any:
    if isinstance(default, Mapping):
        return deep_merge(default, value, path=path)
    _check_type(default, value, path)
    return copy.deepcopy(value)


def _check_type(default: Any, value: Any, path: str) -> None:
    """Reject a user value whose type cannot stand in for the default's.

    Only booleans and numbers are checked: they are where YAML typos bite (`yes`, `"1e-3"`),
    while checking every type would forbid legitimate overrides such as None for a str.
    An int may stand in for a float, never the reverse; a bool for neither.
    """
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if isinstance(default, bool):
        expected, ok = "bool", isinstance(value, bool)
    elif isinstance(default, numbers.Integral):
        expected, ok = "int", is_number and isinstance(value, numbers.Integral)
    elif isinstance(default, numbers.Real):
        expected, ok = "float", is_number
    else:
        return
    if not ok:
        raise AgentConfigError(
            f"{path}: expected {expected}, got {type(value).__name__} ({value!r})"
        )


def _unknown_key_message(key: Any, path: str, defaults: Mapping) -> str:
    valid = [str(k) for k in defaults]
    key_path = f"{path}.{key}" if path else str(key)
    level = f"keys under '{path}'" if path else "top-level keys"
    message = f"unknown config key '{key_path}'; valid {level}: {', '.join(valid)}"
    return message + suggest(str(key), valid)


# ---- files ----------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Writes tuples (common in defaults, e.g. hidden sizes) as plain YAML lists."""


_Dumper.add_representer(tuple, yaml.SafeDumper.represent_list)


class _Loader(yaml.SafeLoader):
    """Reads `1e-3` as a float: PyYAML follows YAML 1.1, which needs a dot (`1.0e-3`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def save_config(config: Mapping, path: str | Path) -> None:
    """Write `config` as YAML in the order given (infinities as `.inf`), atomically."""
    text = yaml.dump(dict(config), Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    atomic_write_bytes(Path(path), text.encode())


def load_config_file(path: str | Path) -> dict:
    """Read a config mapping from a `.json` file or from YAML (any other suffix)."""
    path = Path(path)
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_Loader)
    except OSError as exc:
        raise AgentConfigError(f"cannot read config {path}: {exc}") from exc
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise AgentConfigError(f"{path} is not valid {kind}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AgentConfigError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    return data


__getattr__ = renamed(__name__, {"ConfigError": "AgentConfigError"}, globals())  # 0.1's name
