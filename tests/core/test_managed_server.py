"""eagle3.serving.process, on real processes: health wait, the exact failure messages, stop of the whole process
group (also a server that ignores SIGTERM), handles on external servers, and ServerPhases' stop from another
thread (what on_kill does)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from eagle3.errors import InputError
from eagle3.serving.process import ManagedServer, ServerFailed, ServerPhases, ServerStopped, free_port, http_request
from tests.evaluate.server_processes import alive, wait_dead


class Fake(ManagedServer):
    """``script`` runs under bash; $PORT and $DIR are set. A file named `health` in DIR makes
    `python -m http.server` answer GET /health with 200."""

    engine = "fake"

    def __init__(self, script: str, tmp_path, **kw):
        super().__init__(port=free_port(), log_path=str(tmp_path / "server.log"), **kw)
        (tmp_path / "health").write_text("ok")
        self.script, self.dir = script, tmp_path

    def command(self) -> list[str]:
        return ["bash", "-c", self.script]

    def server_env(self) -> dict[str, str]:
        return {**self.env, "PORT": str(self.port), "DIR": str(self.dir), "PY": sys.executable}


HTTP = 'exec "$PY" -m http.server "$PORT" --bind 127.0.0.1 --directory "$DIR"'


def _child_pid(tmp_path) -> int:
    for _ in range(100):
        if (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text().strip():
            return int((tmp_path / "child.pid").read_text())
        time.sleep(0.05)
    raise AssertionError("the server never wrote its child's pid")


def test_healthy_server_and_its_children_are_stopped_on_exit(tmp_path):
    server = Fake(f'sleep 300 & echo $! > "$DIR/child.pid"; {HTTP}', tmp_path)
    with server as s:
        assert s.healthy() and s.url == f"http://127.0.0.1:{server.port}"
        leader, child = s.proc.pid, _child_pid(tmp_path)
        assert alive(leader) and alive(child)
    assert server.proc is None and not alive(leader) and not alive(child)  # the whole group, not just the leader
    server.stop()  # twice is fine


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    server = Fake(f"trap '' TERM; {HTTP.replace('exec ', '')}", tmp_path).start().wait_healthy(timeout=60)
    leader, t0 = server.proc.pid, time.monotonic()
    server.stop(grace_s=1)
    assert not alive(leader) and time.monotonic() - t0 < 20


def test_exit_before_healthy_names_the_code_and_the_log_tail(tmp_path):
    server = Fake("echo loading model; echo boom >&2; exit 3", tmp_path).start()
    with pytest.raises(ServerFailed) as info:
        server.wait_healthy(timeout=60, poll_s=0.05)
    assert str(info.value) == (f"fake server exited with code 3 before becoming healthy\n"
                               f"last lines of {tmp_path / 'server.log'}:\nloading model\nboom")


def test_timeout_names_the_url_and_the_wait(tmp_path):
    server = Fake("sleep 60", tmp_path).start()
    try:
        with pytest.raises(ServerFailed) as info:
            server.wait_healthy(timeout=1, poll_s=0.05)
        assert str(info.value) == (f"fake server at http://127.0.0.1:{server.port} not healthy after 1 s\n"
                                   f"last lines of {tmp_path / 'server.log'}:\n(no log)")
    finally:
        server.stop(grace_s=1)


def test_connect_takes_only_urls_and_never_starts_or_stops(tmp_path):
    with pytest.raises(InputError) as info:
        Fake.connect("10.0.0.5:30000")
    assert str(info.value) == ("Fake.connect: '10.0.0.5:30000' is not an http(s) URL, e.g. http://10.0.0.5:30000")
    running = Fake(HTTP, tmp_path).start().wait_healthy(timeout=60)
    try:
        handle = Fake.connect(running.url + "/")
        assert handle.url == running.url and handle.start() is handle and handle.proc is None
        handle.wait_healthy(timeout=5).stop()
        assert running.healthy()  # stopping a handle leaves the server alone
    finally:
        running.stop()


def test_phases_stop_from_another_thread_while_waiting_for_health(tmp_path):
    phases, server = ServerPhases(), Fake("sleep 60", tmp_path)
    threading.Timer(1.0, phases.stop).start()
    with pytest.raises(ServerStopped) as info:
        phases.run(server, body=lambda s: pytest.fail("body ran"), health_timeout_s=60)
    assert str(info.value) == "fake server stopped while starting" and server.proc is None
    with pytest.raises(ServerStopped) as info:
        phases.run(Fake(HTTP, tmp_path), body=lambda s: None)
    assert str(info.value) == "stopped before the fake server started"


def test_phases_run_the_body_on_a_healthy_server_then_stop_it(tmp_path):
    server = Fake(HTTP, tmp_path)
    answer = ServerPhases().run(server, body=lambda s: http_request(s.url + "/health", None, 10, RuntimeError))
    assert answer == b"ok" and server.proc is None


def test_http_error_status_raises_the_given_error_with_the_answer(tmp_path):
    with Fake(HTTP, tmp_path) as s:
        with pytest.raises(RuntimeError) as info:
            http_request(s.url + "/missing", None, 10, RuntimeError)
    assert str(info.value).startswith(f"GET {s.url}/missing answered HTTP 404: ")


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert 1024 <= port < 65536


def test_a_server_dies_with_the_process_that_started_it(tmp_path):
    """The server is in a session of its own (so that stop() reaches its workers): a stage SIGKILLed before
    stop() (the OOM killer, Airflow's escalation) used to leave it serving, holding the GPU a retry needs. Now the
    kernel SIGTERMs it (eagle3/lifetime.py)."""
    import os
    import signal
    import subprocess

    starter = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "sys.path.insert(0, '.')\n"
        "from tests.core.test_managed_server import Fake, HTTP\n"
        "from pathlib import Path\n"
        f"s = Fake(HTTP, Path({str(tmp_path)!r})).start().wait_healthy(timeout=60)\n"
        f"Path({str(tmp_path / 'leader.pid')!r}).write_text(str(s.proc.pid))\n"
        "time.sleep(600)\n")], cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    try:
        pid_file = tmp_path / "leader.pid"
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert starter.poll() is None and time.monotonic() < deadline, "the starter never ran the server"
            time.sleep(0.05)
        leader = int(pid_file.read_text())
        assert alive(leader)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        assert wait_dead(leader, 10), "the server outlived the process that started it"
    finally:
        if starter.poll() is None:
            starter.kill()
