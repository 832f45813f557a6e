"""Fixtures for the report page tests: a hand-made run folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_run_folder import write_run


@pytest.fixture
def artifacts(tmp_path) -> Path:
    root = tmp_path / "artifacts"
    write_run(root)
    return root
