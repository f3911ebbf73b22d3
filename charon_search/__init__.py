"""charon-search: simulate LLM training and serving, then search configurations at scale.

The public API is re-exported here lazily so ``import charon_search`` stays fast and CPU-only.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public name -> module that defines it.
_EXPORTS: dict[str, str] = {
    "CharonError": "charon_search.errors",
    "ConfigError": "charon_search.errors",
    "InfeasibleError": "charon_search.errors",
    "Layout": "charon_search.layout",
    "ModelSpec": "charon_search.catalog.spec",
    "load_model": "charon_search.catalog",
    "load_cluster": "charon_search.hardware",
    "load_gpu": "charon_search.hardware",
    "trace_model": "charon_search.frontend",
    "simulate_training": "charon_search.training",
    "framework_layout": "charon_search.frameworks",
    "simulate_serving": "charon_search.serving",
    "memory_report": "charon_search.memory",
    "fits": "charon_search.memory",
}

__all__ = sorted(_EXPORTS)


def __dir__() -> list[str]:
    """The public API beside the module's own names (tab completion, ``help``)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'charon_search' has no attribute {name!r}")
