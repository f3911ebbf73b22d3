"""Helpers shared by the benchmark scripts (argument checks, cache folders, timing).

Imported as ``from _bench import ...``: the scripts are run as ``python benchmarks/<name>.py``,
which puts this folder on ``sys.path``.
"""

from __future__ import annotations

import argparse
import atexit
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from charon_search.errors import ConfigError


def _int_at_least(text: str, low: int) -> int:
    """``text`` as an integer >= ``low``, else argparse's one-line usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1 (a one-line usage error otherwise)."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """argparse ``type=``: an integer >= 0."""
    return _int_at_least(text, 0)


@contextmanager
def config_errors(ap: argparse.ArgumentParser) -> Iterator[None]:
    """Turn a ``ConfigError`` raised while resolving the arguments (an unknown model or
    cluster, a workload the simulator rejects) into ``ap.error``: one line, exit status 2."""
    try:
        yield
    except ConfigError as e:
        ap.error(str(e).splitlines()[0] if str(e) else type(e).__name__)


def fresh_cache_dir(prefix: str = "charon-bench-") -> str:
    """Point ``CHARON_CACHE_DIR`` at a new empty temporary folder (a *cold* disk cache: no
    traced graphs, no trained predictors) that is removed when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["CHARON_CACHE_DIR"] = path
    return path


def temp_dir(prefix: str) -> str:
    """A temporary folder removed when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"min", "median", "max"}`` of repeated measurements."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def same(a: Any, b: Any) -> bool:
    """Equality that takes NaN as equal to NaN (``==`` on containers does not: a JSON
    round trip makes new NaN objects) and a tuple as equal to a list (JSON has no tuples)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def row_diffs(a: Sequence[dict], b: Sequence[dict],
              key: Callable[[dict], Any] = lambda r: r.get("id")) -> tuple[int, str | None]:
    """How many rows of ``a`` and ``b`` differ (NaN-aware, by position) and a description of
    the first difference (row index, the row's ``key``, field, both values), or None."""
    first: str | None = None
    if len(a) != len(b):
        first = f"row counts differ: {len(a)} vs {len(b)}"
    count = abs(len(a) - len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        if same(x, y):
            continue
        count += 1
        if first is None:
            fields = sorted(k for k in x.keys() | y.keys() if not same(x.get(k), y.get(k)))
            f = fields[0]
            first = (f"row {i} ({key(x)}), field {f!r}: {x.get(f, '<missing>')!r} vs "
                     f"{y.get(f, '<missing>')!r}; {len(fields)} field(s) differ: {fields[:8]}")
    return count, first
