"""Where charon-search keeps its on-disk caches (traced graphs, trained predictors).

``CHARON_CACHE_DIR`` overrides the default ``~/.cache/charon-search``.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

__all__ = ["cache_dir", "package_fingerprint", "sources_fingerprint"]


def cache_dir(sub: str = "") -> Path:
    """The cache directory (created on first use), optionally a named subfolder."""
    root = Path(os.environ.get("CHARON_CACHE_DIR", Path.home() / ".cache" / "charon-search"))
    path = root / sub if sub else root
    path.mkdir(parents=True, exist_ok=True)
    return path


@cache
def sources_fingerprint(*parts: str) -> str:
    """A hash of the package's Python sources under ``parts`` (folders or files relative to
    the package, e.g. ``"frontend"``, ``"catalog/_hf.py"``): a cache keyed by it goes stale
    when that code changes, without anyone remembering to bump a version."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for part in parts:
        base = root / part
        if not base.exists():
            raise FileNotFoundError(f"sources_fingerprint: no {part!r} in the package")
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for path in files:
            if "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


@cache
def package_fingerprint() -> str:
    """A hash of the installed package's code and data (``*.py``, ``*.yaml``, ``*.json``,
    ``*.csv``, ``*.parquet``): results cached under it go stale with any change to the
    simulators, their specs or their measured data (~30 ms to compute)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if (path.suffix in (".py", ".yaml", ".json", ".csv", ".parquet") and path.is_file()
                and "__pycache__" not in path.parts):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]
