"""One inference server process started by a stage, and stopped whatever happens.

    with VLLMServer("/models/smollm2", port=free_port()) as server:   # or SGLangServer(...)
        requests.post(server.url + "/v1/completions", ...)

`ManagedServer` is the lifecycle both engines share: start the argv an engine class
builds (:meth:`command`) in a new session with its output in a log file, poll
``GET /health`` until 200, and on exit terminate the server's whole process group
(engines start scheduler, worker and detokenizer subprocesses, which must not outlive
it), then kill what is left. ``connect(url)`` wraps a server someone else runs: same
interface, start/stop do nothing. When the process exits before it is healthy, the
error holds :meth:`diagnose` (an engine's reading of its own log: which file and key
were wrong) and the log's tail.

A stage that runs servers in phases (baseline, then speculative) keeps one
`ServerPhases`: its ``stop()`` (the operator's on_kill path, from another thread)
stops the server that is running and refuses to start another.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from eagle3.errors import Eagle3Error, InputError
from eagle3.lifetime import parent_death_preexec

log = logging.getLogger(__name__)

_ERROR_LINE = re.compile(r"\b(\w*(?:Error|Exception)): (.+)$")


def last_error_line(log_text: str) -> tuple[str, str] | None:
    """(exception type, message) of the last ``SomeError: message`` line of a server log (Python tracebacks
    of vLLM and SGLang end with one), or None."""
    errors = [m.groups() for m in map(_ERROR_LINE.search, log_text.splitlines()) if m]
    return errors[-1] if errors else None


STOP_GRACE_S = 30.0
"""How long `ManagedServer.stop` waits after SIGTERM before SIGKILL: a vLLM server with tensor-parallel workers
takes seconds to free its GPUs."""
STOP_MAX_S = STOP_GRACE_S + 20.0
"""The most `stop` takes: the grace, 10 s for the SIGKILLed leader, 10 s for its group (`_wait_group_gone`)."""


class ServerFailed(Eagle3Error):
    """The server exited or never became healthy; the message holds its log tail."""


class ServerStopped(Eagle3Error):
    """The stage was stopped (on_kill) while a server was starting or running."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    """Return once no live process is left in the group (SIGKILL is delivered asynchronously; orphaned
    workers are reaped by init, so a zombie counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                live.append(stat)
        if not live:
            return
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    log.warning("processes of group %d still alive %.0f s after SIGKILL", pgid, timeout)


class ManagedServer:
    """One server process (or a handle on a running one, see ``connect``). Subclasses set ``engine``
    and build :meth:`command`; they may read their log in :meth:`diagnose`."""

    engine = "server"

    def __init__(self, port: int, host: str = "127.0.0.1", log_path: str | None = None,
                 env: dict[str, str] | None = None):
        """``env`` is added to the server's environment; ``log_path`` receives its stdout and stderr, fresh at
        every start (see `start`); without one, each start writes a new file in the temp folder."""
        self.port, self.host = int(port), host
        self._given_log = log_path
        self.log_path = log_path or ""
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self._external_url: str | None = None

    @classmethod
    def connect(cls, url: str):
        """A handle on an already-running server: ``wait_healthy`` works, start/stop do nothing."""
        if not url.startswith(("http://", "https://")):
            raise InputError(f"{cls.__name__}.connect: {url!r} is not an http(s) URL, e.g. http://10.0.0.5:30000")
        self = cls.__new__(cls)
        self.proc, self._external_url, self.env = None, url.rstrip("/"), {}
        self.log_path = f"(the log of the external server at {url})"
        return self

    @property
    def url(self) -> str:
        """Base URL; the OpenAI-compatible API is under ``url + "/v1"``."""
        return self._external_url or f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def server_env(self) -> dict[str, str]:
        """The environment added to os.environ for the process (engines add their defaults)."""
        return dict(self.env)

    def diagnose(self, log_text: str) -> str | None:
        """What went wrong, read from the server's log: its last error line (None: nothing recognised).
        Engines may add what it points at (VLLMServer: the draft file and key)."""
        said = last_error_line(log_text)
        return f"{self.engine} said: {said[0]}: {said[1].strip()}" if said else None

    def start(self):
        if self._external_url or self.proc is not None:
            return self
        env = {**os.environ, **self.server_env()}
        # A fresh log per start: the failure diagnosis reads the whole file, and an earlier server's error on
        # the same port or path must not be reported as this one's. A given path's previous log is kept beside.
        if self._given_log:
            self.log_path = self._given_log
            Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
            if os.path.exists(self.log_path):
                os.replace(self.log_path, self.log_path + ".previous")
        else:
            fd, self.log_path = tempfile.mkstemp(prefix=f"{self.engine}-server-{self.port}-", suffix=".log")
            os.close(fd)
        log.info("starting %s: %s (log %s)", self.engine, " ".join(self.command()), self.log_path)
        with open(self.log_path, "wb") as logf:
            # A new session makes the server the leader of its own process group,
            # so stop() can signal it together with every worker it spawns.
            # ... and the kernel stops it if this process dies without stop() (eagle3/lifetime.py).
            self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=parent_death_preexec())
        return self

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:]) or "(no log)"

    def _failure(self, what: str) -> ServerFailed:
        cause = self.diagnose(self.log_text())
        return ServerFailed(f"{self.engine} server {what}" + (f":\n{cause}" if cause else "")
                            + f"\nlast lines of {self.log_path}:\n{self._log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout: float = 600.0, poll_s: float = 0.5, stopped=lambda: False):
        """Poll GET /health until 200. Raises ServerFailed if the process exits or ``timeout`` passes,
        ServerStopped as soon as ``stopped()`` is true."""
        deadline = time.monotonic() + timeout
        while True:
            if stopped():
                raise ServerStopped(f"{self.engine} server stopped while starting")
            if self.healthy():
                log.info("%s server healthy at %s", self.engine, self.url)
                return self
            if self.proc is not None and self.proc.poll() is not None:
                raise self._failure(f"exited with code {self.proc.returncode} before becoming healthy")
            if time.monotonic() > deadline:
                raise self._failure(f"at {self.url} not healthy after {timeout:.0f} s")
            time.sleep(poll_s)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, wait ``grace_s``, then SIGKILL it. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the group id is the leader's pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; children in the group may linger, so kill the group.
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        if proc.poll() is None:
            proc.wait(timeout=10)
        _wait_group_gone(pgid)
        log.info("%s server (pid %d) stopped", self.engine, pgid)

    def __enter__(self):
        self.start()
        try:
            return self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerPhases:
    """Runs servers one after another for a stage; ``stop()`` may come from another thread (on_kill)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._server: ManagedServer | None = None
        self.stopped = False

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            server, self._server = self._server, None
        if server is not None:
            server.stop()

    def run(self, server: ManagedServer, body, health_timeout_s: float = 1800.0):
        """Start ``server``, wait for health, return ``body(server)``; the server is stopped on any exit."""
        with self._lock:
            if self.stopped:
                raise ServerStopped(f"stopped before the {server.engine} server started")
            self._server = server
        try:
            server.start()
            server.wait_healthy(timeout=health_timeout_s, stopped=lambda: self.stopped)
            return body(server)
        finally:
            with self._lock:
                self._server = None
            server.stop()


def http_request(url: str, payload: dict | None, timeout: float, error: type[Exception]) -> bytes:
    """GET ``url`` (or POST ``payload`` as JSON); an HTTP error status raises ``error`` with the server's answer."""
    import json

    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                 method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise error(f"{req.method} {url} answered HTTP {e.code}: {e.read()[:500].decode(errors='replace')}") from None
