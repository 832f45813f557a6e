"""GPU leases: flock per device, exclusive across processes, released when the holder dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3.devices import lease_device
from eagle3.errors import InputError

REPO = Path(__file__).resolve().parents[2]

_HOLDER = """
import sys, time
from eagle3.devices import lease_device
with lease_device(1, root=sys.argv[1], device_count=int(sys.argv[2]), poll_s=0.05) as ids:
    print("leased", ids, flush=True)
    time.sleep(float(sys.argv[3]))
print("released", flush=True)
"""


def _holder(root, count, hold_s=600):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root), str(count), str(hold_s)],
                            stdout=subprocess.PIPE, text=True, env=env)
    return proc


def _wait_line(proc, prefix, timeout=60):
    deadline = time.time() + timeout
    line = proc.stdout.readline()
    assert line.startswith(prefix), line
    assert time.time() < deadline
    return line


def test_cpu_is_a_noop(tmp_path):
    with lease_device(1, root=str(tmp_path), device_count=0) as ids:
        assert ids == "cpu"
    with lease_device(0, root=str(tmp_path), device_count=4) as ids:
        assert ids == "cpu"
    assert not list(tmp_path.iterdir())  # no lock files on CPU


def test_second_process_takes_the_next_device(tmp_path):
    holder = _holder(tmp_path, 2)
    try:
        assert _wait_line(holder, "leased").strip() == "leased [0]"
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        with lease_device(1, root=str(tmp_path), device_count=2, timeout_s=5) as ids:
            assert ids == [1]
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"  # what subprocesses will see
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == before
    finally:
        holder.kill()
        holder.wait()


def test_second_process_waits_until_the_first_releases(tmp_path):
    with lease_device(1, root=str(tmp_path), device_count=1) as ids:
        assert ids == [0]
        waiter = _holder(tmp_path, 1, hold_s=0)
        time.sleep(2.0)
        assert waiter.poll() is None  # still waiting for the only device
    assert _wait_line(waiter, "leased").strip() == "leased [0]"
    assert waiter.wait(timeout=60) == 0


def test_sigkilled_holder_leaks_nothing(tmp_path):
    holder = _holder(tmp_path, 1)
    _wait_line(holder, "leased")
    with pytest.raises(TimeoutError, match="no 1 free GPU"):
        with lease_device(1, root=str(tmp_path), device_count=1, timeout_s=0.3, poll_s=0.05):
            pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with lease_device(1, root=str(tmp_path), device_count=1, timeout_s=5) as ids:
        assert ids == [0]


def test_two_gpus_in_one_lease_and_visible_device_mapping(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    with lease_device(2, root=str(tmp_path)) as ids:
        assert ids == [0, 1] and os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-3.lock", "gpu-5.lock"]
        # a nested lease sees only "3,5", both held (flocks conflict even within one process)
        with pytest.raises(TimeoutError):
            with lease_device(1, root=str(tmp_path), timeout_s=0.3, poll_s=0.05):
                pass
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5,6"
    with pytest.raises(InputError, match="only 3 visible"):
        with lease_device(4, root=str(tmp_path)):
            pass
