"""The supervised subprocess that extraction and training run in."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from eagle3.errors import GateFailed, GpuOutOfMemory, InputError
from operators.supervised import SupervisedProcess


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_exit_codes_pick_the_error_class():
    with pytest.raises(GpuOutOfMemory, match="saved micro-batch"):
        SupervisedProcess(_py("print('saved micro-batch 256'); raise SystemExit(75)")).run()
    with pytest.raises(InputError, match="bad.jsonl:3"):
        SupervisedProcess(_py("import sys; print('bad.jsonl:3: malformed JSON'); sys.exit(2)")).run()
    with pytest.raises(GateFailed, match="differs at position 7"):
        SupervisedProcess(_py("print('prompt 3 differs at position 7'); raise SystemExit(3)")).run()
    with pytest.raises(RuntimeError, match="exited with 1"):
        SupervisedProcess(_py("raise SystemExit(1)")).run()
    SupervisedProcess(_py("print('ok')")).run()


def test_kill_stops_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # The child starts a grandchild (like torchrun's workers) and both ignore nothing.
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    proc = SupervisedProcess(_py(code))
    errors = []
    runner = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, proc.run)))
    runner.start()
    deadline = time.time() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    proc.kill(grace_s=2)
    runner.join(timeout=30)
    assert not runner.is_alive()
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet (a container's PID 1 may not)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                state = next(line for line in f if line.startswith("State:"))
        except FileNotFoundError:
            return False
        if "Z" in state.split()[1]:
            return False
        time.sleep(0.1)
    return True
