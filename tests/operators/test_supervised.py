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


def _wait_for(path, within_s: float = 30) -> str:
    deadline = time.time() + within_s
    while not (path.exists() and path.read_text()):
        assert time.time() < deadline, f"{path} never written"
        time.sleep(0.05)
    return path.read_text()


def test_the_stage_dies_with_a_task_process_killed_outright(tmp_path):
    """The CLI runs in a session of its own (so that kill() reaches its workers). A task process SIGKILLed (Airflow
    escalates 5 s after SIGTERM; the OOM killer) used to leave it running, unseen, holding its GPU lease; now the
    kernel SIGTERMs it (eagle3/lifetime.py)."""
    import os
    import signal
    import subprocess

    pid_file = tmp_path / "stage.pid"
    stage = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    task = subprocess.Popen([sys.executable, "-c", (
        "import sys\n"
        "from operators.supervised import SupervisedProcess\n"
        f"SupervisedProcess([sys.executable, '-c', {stage!r}]).run()\n")],
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    try:
        child = int(_wait_for(pid_file))
        os.kill(task.pid, signal.SIGKILL)
        task.wait()
        assert not _alive(child), "the stage outlived its task process"
    finally:
        if task.poll() is None:
            task.kill()


def test_a_second_sigterm_does_not_cut_the_cleanup_short(tmp_path):
    """The first SIGTERM (on_kill) sends the CLI through its `finally` blocks, which stop its server (up to
    ~50 s); the second (the task process then dying) must not interrupt them."""
    import os
    import signal
    import subprocess

    started, done = tmp_path / "cleanup.started", tmp_path / "cleanup.done"
    cli = subprocess.Popen([sys.executable, "-c", (
        "import signal, time\n"
        "from eagle3.cli import _exit_on_sigterm\n"
        "signal.signal(signal.SIGTERM, _exit_on_sigterm)\n"
        f"open({str(tmp_path / 'ready')!r}, 'w').write('1')\n"
        "try:\n"
        "    time.sleep(600)\n"
        "finally:\n"
        f"    open({str(started)!r}, 'w').write('1')\n"
        "    time.sleep(1.0)\n"
        f"    open({str(done)!r}, 'w').write('1')\n")],
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    try:
        _wait_for(tmp_path / "ready")
        os.kill(cli.pid, signal.SIGTERM)
        _wait_for(started)
        os.kill(cli.pid, signal.SIGTERM)
        assert cli.wait(timeout=30) == 128 + signal.SIGTERM
        assert done.exists()
    finally:
        if cli.poll() is None:
            cli.kill()
