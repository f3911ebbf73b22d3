"""Shared fixtures. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

# Keep tests CPU-only, quiet and reproducible.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Point the trace/predictor caches at a per-session folder unless the user set one."""
    if "CHARON_CACHE_DIR" not in os.environ:
        os.environ["CHARON_CACHE_DIR"] = str(tmp_path_factory.mktemp("charon-cache"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
