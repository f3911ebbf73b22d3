"""Fixtures of the validation tests: the shipped records, and fake simulators."""

from __future__ import annotations

import pytest

from charon_search.validation import default_files, load_files


@pytest.fixture(scope="session")
def shipped_records():
    return load_files(default_files())


@pytest.fixture(scope="session")
def by_id(shipped_records):
    return {r.id: r for r in shipped_records}
