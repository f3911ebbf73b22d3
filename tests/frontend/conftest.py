"""Traced debug models shared by the frontend tests (traced once per session)."""

from __future__ import annotations

import pytest

from charon_search.frontend import TracedModel, trace_model


@pytest.fixture(scope="session")
def llama_train() -> TracedModel:
    return trace_model("debug-llama", "train")


@pytest.fixture(scope="session")
def moe_train() -> TracedModel:
    return trace_model("debug-moe", "train")


@pytest.fixture(scope="session")
def llama_decode() -> TracedModel:
    return trace_model("debug-llama", "decode")
