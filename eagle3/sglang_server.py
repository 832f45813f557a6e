"""Launch (or connect to) an SGLang server and stop it cleanly.

    with SGLangServer("/models/llama-8b", tp=2, gpus=[0, 1]) as server:
        regenerate(cfg_with(base_url=server.url))

builds and runs

    python -m sglang.launch_server --model-path /models/llama-8b --tp-size 2 --host 127.0.0.1 --port P

with ``CUDA_VISIBLE_DEVICES=0,1``, waits until ``GET /health`` answers 200,
and on exit terminates the server's whole process group (SGLang starts
scheduler and detokenizer subprocesses, which must not outlive it), then kills
what is left. ``SGLangServer.connect(url)`` wraps a server someone else runs:
same interface, but start/stop do nothing.

The flags come from SGLang's ``python/sglang/srt/server_args.py``:
``--model-path``, ``--tp-size`` (alias ``--tensor-parallel-size``), ``--host``,
``--port`` and the speculative group ``--speculative-algorithm``,
``--speculative-draft-model-path``, ``--speculative-num-steps``,
``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``. SGLang cannot
run on this machine (no GPU), so the command line and the lifecycle are tested
against a fake ``sglang.launch_server`` module that speaks ``/health``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from eagle3.errors import Eagle3Error, InputError

log = logging.getLogger(__name__)

# speculative dict key -> SGLang flag (server_args.py, section "Speculative decoding")
SPECULATIVE_FLAGS = {
    "algorithm": "--speculative-algorithm",
    "draft_model_path": "--speculative-draft-model-path",
    "num_steps": "--speculative-num-steps",
    "eagle_topk": "--speculative-eagle-topk",
    "num_draft_tokens": "--speculative-num-draft-tokens",
}
# Flags this class sets itself; passing them again in extra_args would be ambiguous.
_MANAGED_FLAGS = {"--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--tp", "--host", "--port",
                  *SPECULATIVE_FLAGS.values()}


class ServerFailed(Eagle3Error):
    """The server exited or never became healthy; the message holds its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def eagle3_speculative(draft_dir: str, steps: int = 3, topk: int = 1) -> dict:
    """The speculative settings for an EAGLE-3 draft; with topk 1, draft tokens = steps + 1."""
    return {"algorithm": "EAGLE3", "draft_model_path": draft_dir, "num_steps": steps, "eagle_topk": topk,
            "num_draft_tokens": steps + 1 if topk == 1 else steps * topk + 1}


class SGLangServer:
    """One SGLang server process (or a handle on a running one, see ``connect``)."""

    def __init__(self, model_path: str, tp: int = 1, port: int = 30000, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (), speculative: dict | None = None,
                 gpus: Sequence[int] | None = None, log_path: str | None = None,
                 env: dict[str, str] | None = None, python: str | None = None,
                 module: str = "sglang.launch_server"):
        """``extra_args`` go verbatim after the managed flags (e.g. ``["--mem-fraction-static", "0.8"]``);
        ``gpus`` becomes CUDA_VISIBLE_DEVICES; ``env`` is added to the server's environment;
        ``log_path`` receives the server's stdout and stderr (default: a file in the cwd's tmp)."""
        if not isinstance(tp, int) or tp < 1:
            raise InputError(f"SGLangServer: tp={tp!r} must be a positive integer (the tensor-parallel size)")
        if gpus is not None and len(gpus) < tp:
            raise InputError(f"SGLangServer: tp={tp} needs at least {tp} GPUs, got gpus={list(gpus)}")
        clash = sorted({a.split("=", 1)[0] for a in extra_args} & _MANAGED_FLAGS)
        if clash:
            raise InputError(f"SGLangServer: extra_args set {', '.join(clash)}, which are managed by the "
                             "model_path/tp/host/port/speculative parameters; pass them there instead")
        unknown = sorted(set(speculative or {}) - set(SPECULATIVE_FLAGS))
        if unknown:
            raise InputError(f"SGLangServer: unknown speculative key(s) {', '.join(unknown)}; "
                             f"valid keys: {', '.join(SPECULATIVE_FLAGS)}")
        self.model_path, self.tp, self.port, self.host = model_path, tp, int(port), host
        self.extra_args, self.speculative = list(extra_args), dict(speculative or {})
        self.gpus = None if gpus is None else [int(g) for g in gpus]
        self.log_path = log_path or os.path.join("/tmp", f"sglang-server-{self.port}.log")
        # The GPU image installs SGLang in its own venv (its torch pin differs from ours).
        python = python or os.environ.get("EAGLE3_SGLANG_PYTHON") or sys.executable
        self.env, self.python, self.module = dict(env or {}), python, module
        self.proc: subprocess.Popen | None = None
        self._external_url: str | None = None

    @classmethod
    def connect(cls, url: str) -> "SGLangServer":
        """A handle on an already-running server: ``wait_healthy`` works, start/stop do nothing."""
        if not url.startswith(("http://", "https://")):
            raise InputError(f"SGLangServer.connect: {url!r} is not an http(s) URL, e.g. http://10.0.0.5:30000")
        self = cls.__new__(cls)
        self.proc, self._external_url = None, url.rstrip("/")
        self.log_path = f"(the log of the external server at {url})"
        return self

    @property
    def url(self) -> str:
        """Base URL; the OpenAI-compatible API is under ``url + "/v1"``."""
        return self._external_url or f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The exact argv the server is started with."""
        cmd = [self.python, "-m", self.module, "--model-path", str(self.model_path), "--tp-size", str(self.tp),
               "--host", self.host, "--port", str(self.port)]
        for key, flag in SPECULATIVE_FLAGS.items():
            if key in self.speculative and self.speculative[key] is not None:
                cmd += [flag, str(self.speculative[key])]
        return cmd + [str(a) for a in self.extra_args]

    def start(self) -> "SGLangServer":
        if self._external_url or self.proc is not None:
            return self
        env = {**os.environ, **self.env}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        log.info("starting SGLang: %s (log %s)", " ".join(self.command()), self.log_path)
        with open(self.log_path, "ab") as logf:
            # A new session makes the server the leader of its own process group,
            # so stop() can signal it together with every worker it spawns.
            self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        return self

    def _log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout: float = 600.0, poll_s: float = 0.5) -> "SGLangServer":
        """Poll GET /health until 200. Raises ServerFailed if the process exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if self.healthy():
                log.info("SGLang server healthy at %s", self.url)
                return self
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerFailed(f"SGLang server exited with code {self.proc.returncode} before becoming "
                                   f"healthy; last lines of {self.log_path}:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise ServerFailed(f"SGLang server at {self.url} not healthy after {timeout:.0f} s; "
                                   f"last lines of {self.log_path}:\n{self._log_tail()}")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 30.0) -> None:
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
        log.info("SGLang server (pid %d) stopped", pgid)

    def __enter__(self) -> "SGLangServer":
        self.start()
        try:
            return self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
