"""A server's failure is diagnosed from its own start's log, never from an earlier server's (eagle3.serving)."""

from __future__ import annotations

import sys

import pytest

from eagle3.serving.process import ManagedServer, ServerFailed


class Failing(ManagedServer):
    """Prints a line and exits before becoming healthy, as a server whose model failed to load."""

    engine = "fake"

    def __init__(self, line: str, **kw):
        super().__init__(port=1, **kw)  # port 1: nothing answers /health there
        self.line = line

    def command(self) -> list[str]:
        return [sys.executable, "-c", f"print({self.line!r})"]

    def diagnose(self, log_text: str) -> str | None:
        return next((ln for ln in log_text.splitlines() if ln.startswith("ERROR")), None)


def _failure(server: ManagedServer) -> str:
    with pytest.raises(ServerFailed) as info:
        server.start().wait_healthy(timeout=30, poll_s=0.05)
    server.stop()
    return str(info.value)


def test_each_start_has_a_fresh_log_and_the_previous_is_kept(tmp_path):
    log = tmp_path / "server.log"
    first = _failure(Failing("ERROR first server: bad checkpoint", log_path=str(log)))
    assert "ERROR first server" in first
    second = _failure(Failing("ERROR second server: out of memory", log_path=str(log)))
    assert "ERROR second server" in second and "first server" not in second
    assert "first server" in (tmp_path / "server.log.previous").read_text()


def test_without_a_path_two_servers_on_one_port_write_two_logs():
    a, b = Failing("ERROR a"), Failing("ERROR b")
    assert "ERROR a" in _failure(a) and "ERROR a" not in _failure(b)
    assert a.log_path != b.log_path
