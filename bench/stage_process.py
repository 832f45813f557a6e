"""Run one `eagle3 <stage>` as its own process for a bench script (storage_acceptance_bench, paired_bench).

    seconds = run_stage(["train", "--config", cfg], log_path)   # output to log_path; a failure ends the bench
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from operators.supervised import eagle3_cli  # noqa: E402  (this checkout's, found through REPO)


def run_stage(args: list[str], log_path: str) -> float:
    """Run ``eagle3 <args>`` from the checkout, stdout and stderr to ``log_path``; the wall seconds it took.
    A non-zero exit ends the bench (SystemExit) naming the stage, its exit code and the log."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.call(eagle3_cli(*args), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                               env={**os.environ, "PYTHONPATH": REPO})
    if code:
        raise SystemExit(f"`eagle3 {args[0]}` failed (exit {code}); see {log_path}")
    return time.monotonic() - t0
