"""Fixtures of the extraction tests."""

from __future__ import annotations

import pytest

from extract_testdata import make_samples, write_merged


@pytest.fixture
def merged_small(tmp_path):
    return write_merged(tmp_path / "merged", make_samples(24, seed=1))
