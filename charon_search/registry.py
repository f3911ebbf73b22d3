"""A generic name -> object registry used for passes, cost backends, collectives, schedulers, ...

Keys are short lowercase strings that appear in YAML files and reports, so once published they are
API. Registering a key twice raises; looking up an unknown key raises ``ConfigError`` listing the
valid names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from charon_search.errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps string keys to registered objects (usually classes or factory functions).

    Example:
        >>> PASSES: Registry[type] = Registry("pass")
        >>> @PASSES.register("tp")
        ... class TensorParallelPass: ...
        >>> PASSES.get("tp").__name__
        'TensorParallelPass'
    """

    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self._entry_point_group = entry_point_group
        self._entries: dict[str, T] = {}
        self._loaded_entry_points = False

    def register(self, key: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``key``; a duplicate key raises ``ValueError``."""

        def decorator(obj: T) -> T:
            self.add(key, obj)
            return obj

        return decorator

    def add(self, key: str, obj: T) -> None:
        if key in self._entries:
            raise ValueError(f"{self.kind} {key!r} is already registered")
        self._entries[key] = obj

    def _load_entry_points(self) -> None:
        if self._loaded_entry_points or self._entry_point_group is None:
            return
        self._loaded_entry_points = True
        for ep in entry_points(group=self._entry_point_group):
            if ep.name not in self._entries:
                self._entries[ep.name] = ep.load()

    def get(self, key: str) -> T:
        """The object registered under ``key``; ``ConfigError`` naming the choices if unknown."""
        self._load_entry_points()
        try:
            return self._entries[key]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {key!r}; must be one of {sorted(self._entries)}"
            ) from None

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._entries)

    def __contains__(self, key: object) -> bool:
        self._load_entry_points()
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
