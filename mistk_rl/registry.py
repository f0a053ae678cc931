"""Extension points, each declared once, next to its code.

A `Registry` holds the named entries of one kind (league player types, built-in game
opponents, ...). Code declares an entry where it is written (``@PLAYER_TYPES.register("main")``
above the class); everything that lists the kind reads the registry: the OpenAPI documents'
enums (a schema marked ``x-mistk-registry: NAME`` gets ``enum`` filled in when the service
loads its spec), the request models' validation (`Registry.validate`), messages and help.
gymnasium's ``register`` and DI-engine's registries are the model.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


def did_you_mean(name: str, valid: list[str], what: str) -> str:
    """``unknown WHAT 'x'; known: a, b. Did you mean 'a'?`` (the suggestion when one is close)."""
    return f"unknown {what} {name!r}; known: {', '.join(valid) or 'none'}{suggest(name, valid)}"


def suggest(name: str, valid: list[str]) -> str:
    """``. Did you mean 'a'?`` when a valid name is close to `name`, else ''."""
    close = difflib.get_close_matches(str(name), valid, n=1)
    return f". Did you mean '{close[0]}'?" if close else ""


class Registry(Generic[T]):
    """Named entries of one kind; `Registry.named(name)` finds a registry by its name (the
    one the spec's ``x-mistk-registry`` gives)."""

    _all: dict[str, "Registry"] = {}

    def __init__(self, name: str, what: str) -> None:
        """`name`: how the spec refers to it; `what`: one entry, in messages."""
        if name in Registry._all:
            raise ValueError(f"a registry named {name!r} exists already")
        self.name, self.what = name, what
        self._entries: dict[str, T] = {}
        Registry._all[name] = self

    @classmethod
    def named(cls, name: str) -> "Registry":
        if name not in cls._all:
            raise KeyError(did_you_mean(name, sorted(cls._all), "registry"))
        return cls._all[name]

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator: ``@REGISTRY.register("name")`` above the class or function."""
        return lambda entry: self.add(name, entry)

    def names(self) -> list[str]:
        """In declaration order."""
        return list(self._entries)

    def validate(self, name: str) -> str:
        """`name` if registered, else ValueError saying what is known (for request models)."""
        if name not in self._entries:
            raise ValueError(did_you_mean(name, self.names(), self.what))
        return name

    def __getitem__(self, name: str) -> T:
        if name not in self._entries:
            raise KeyError(did_you_mean(name, self.names(), self.what))
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self):
        return self._entries.items()
