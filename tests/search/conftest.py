"""Fixtures of the search tests: the enumerable toy space (closed-form evaluator, no simulator)."""

from __future__ import annotations

from pathlib import Path

import pytest

from charon_search.search import load_objective, load_space

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def toy_space():
    return load_space(DATA / "toy-space.yaml")


@pytest.fixture(scope="session")
def toy_objective():
    return load_objective(DATA / "toy-objective.yaml")


@pytest.fixture(scope="session")
def toy_exhaustive(toy_space, toy_objective):
    """Every valid toy point evaluated directly (no study): rows with config + record."""
    from charon_search.search.evaluators import ToyAnalyticEvaluator

    ev = ToyAnalyticEvaluator()
    rows = []
    for _, cfg in toy_space.enumerate_valid():
        rec = ev.evaluate(cfg)
        if rec["feasible"] and rec["peak_memory_bytes"] <= rec["device_memory_bytes"]:
            rows.append({**cfg, **rec})
    return rows
