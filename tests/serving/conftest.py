"""Fixtures of the serving tests: a closed-form iteration cost model and the toy cluster."""

from __future__ import annotations

import pytest

from charon_search.serving import AffineIterationCostModel
from charon_search.testing import toy_cluster


@pytest.fixture
def affine() -> AffineIterationCostModel:
    """5 ms per iteration + 10 us per token + 0.1 us per key read + 1 ns per causal pair."""
    return AffineIterationCostModel(base_s=5e-3, per_token_s=1e-5, per_kv_token_s=1e-7,
                                    per_attention_pair_s=1e-9)


@pytest.fixture
def cluster():  # type: ignore[no-untyped-def]
    return toy_cluster()

