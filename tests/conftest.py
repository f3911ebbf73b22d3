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


@pytest.fixture(scope="module")
def local_ray():
    """A local 2-CPU Ray instance for the module (none already running in this process)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=80 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()
