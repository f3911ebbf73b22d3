"""Where charon-search keeps its on-disk caches (traced graphs, trained predictors).

``CHARON_CACHE_DIR`` overrides the default ``~/.cache/charon-search``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(sub: str = "") -> Path:
    """The cache directory (created on first use), optionally a named subfolder."""
    root = Path(os.environ.get("CHARON_CACHE_DIR", Path.home() / ".cache" / "charon-search"))
    path = root / sub if sub else root
    path.mkdir(parents=True, exist_ok=True)
    return path
