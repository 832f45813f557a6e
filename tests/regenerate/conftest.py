"""Fixtures for the regenerate tests (helpers live in regen_helpers.py)."""

from __future__ import annotations

import pytest
from regen_helpers import FakeServer


@pytest.fixture
def fake_server(tmp_path):
    """Factory: fake_server("--fail-first", "2") starts one; all are stopped at teardown."""
    servers = []

    def make(*args: str, start: bool = True) -> FakeServer:
        s = FakeServer(tmp_path / f"server-{len(servers)}.jsonl", *args)
        servers.append(s)
        return s.start() if start else s

    yield make
    for s in servers:
        s.stop()


