"""Temporary ``forward`` swaps of HF module classes while a model is traced."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["swapped_forwards"]


@contextlib.contextmanager
def swapped_forwards(swaps: Iterable[tuple[type, Callable[..., Any]]]) -> Iterator[None]:
    """Set each class's ``forward`` to its replacement for the duration; restore on exit."""
    saved: list[tuple[type, Any]] = []
    try:
        for cls, fwd in swaps:
            saved.append((cls, cls.forward))
            cls.forward = fwd  # type: ignore[method-assign]
        yield
    finally:
        for cls, fwd in reversed(saved):
            cls.forward = fwd  # type: ignore[method-assign]
