"""Fixtures for the draft tests (helpers live in tests/draft/tiny.py)."""

from __future__ import annotations

import pytest

from tests.draft.tiny import make_tiny_draft


@pytest.fixture
def tiny_draft():
    return make_tiny_draft()
