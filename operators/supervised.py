"""Run a stage's CLI in a supervised subprocess (regeneration, extraction, training, evaluation).

GPU work must not run in the task process (it is forked from the supervisor
and must never initialise CUDA), and a long run must die with the task: the
child gets its own process group, which `kill()` ends on `on_kill`, and dies with the task process
(eagle3/lifetime.py) if that is killed outright.
The child's exit code carries the error class (eagle3.errors): 75 →
GpuOutOfMemory (retry), 2 → InputError and 3 → GateFailed (no retry), anything
else → a plain failure (default retries).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import time

from eagle3.errors import error_for_exit
from eagle3.lifetime import parent_death_preexec
from eagle3.serving.process import STOP_MAX_S

KILL_GRACE_S = STOP_MAX_S + 5.0
"""SIGTERM to SIGKILL of the CLI's group: long enough for the CLI to stop the inference server it started (a
server is in a session of its own, out of reach of the group's SIGKILL)."""


class SupervisedProcess:
    def __init__(self, argv: list[str], env: dict[str, str] | None = None, log: logging.Logger | None = None):
        self.argv = argv
        self.env = {**os.environ, **(env or {})}
        self.log = log or logging.getLogger(__name__)
        self.proc: subprocess.Popen | None = None
        # "extract", "train", ...: the word after the module, for messages
        self.stage = argv[argv.index("eagle3.cli") + 1] if "eagle3.cli" in argv[:-1] else argv[0]

    def run(self) -> None:
        """Run to completion, streaming output into the task log; raise on failure."""
        self.log.info("running: %s", " ".join(self.argv))
        tail: collections.deque[str] = collections.deque(maxlen=20)
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, start_new_session=True, preexec_fn=parent_death_preexec(),
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            self.log.info("%s", line)
        code = self.proc.wait()
        if code != 0:
            raise error_for_exit(code, f"{self.stage} exited with {code}:\n" + "\n".join(tail))

    def kill(self, grace_s: float = KILL_GRACE_S) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after grace_s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
        if self.proc.poll() is None:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()


def eagle3_cli(*args: str) -> list[str]:
    """argv for the eagle3 CLI with this interpreter."""
    return [sys.executable, "-m", "eagle3.cli", *args]
