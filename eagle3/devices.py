"""GPU leases: one flock file per device, so parallel tasks on one host each get their own GPU.

A lease is an exclusive ``flock`` on ``<root>/gpu-<id>.lock``. The kernel drops
a flock when its process dies (even by SIGKILL), so a crashed task cannot leak
a device: there is no stale-lock cleanup to get wrong. Airflow's pool ``gpu``
caps how many tasks run; the lease decides WHICH device each one gets.

    with lease_device(1) as ids:   # e.g. [1]; "cpu" when there is no GPU
        ...                        # CUDA_VISIBLE_DEVICES now names only the leased GPU(s)

No torch import at module level: the Airflow worker imports this before forking.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

from eagle3.errors import InputError

log = logging.getLogger(__name__)

LEASE_DIR_ENV = "EAGLE3_LEASE_DIR"
DEVICE_COUNT_ENV = "EAGLE3_DEVICE_COUNT"  # override GPU discovery (tests, odd hosts)


def default_lease_root() -> str:
    return os.environ.get(LEASE_DIR_ENV, "/tmp/eagle3-gpu-leases")


def visible_devices() -> list[str]:
    """Physical ids of the GPUs this process may use (CUDA_VISIBLE_DEVICES order).

    Counted without initializing CUDA in this process (initializing it would fix
    the visible set before the lease can narrow it).
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if os.environ.get(DEVICE_COUNT_ENV):
        return [str(i) for i in range(int(os.environ[DEVICE_COUNT_ENV]))]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
            return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
        except (OSError, subprocess.SubprocessError):
            pass
    return []


DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_device(name: str, where: str = "device") -> str:
    """Refuse anything but auto, cpu, cuda or cuda:<i>."""
    if name in DEVICE_CHOICES or (isinstance(name, str) and name.startswith("cuda:") and name[5:].isdigit()):
        return name
    raise InputError(f"{where}={name!r}: use auto, cpu, cuda or cuda:<i>")


def resolve_device(name: str = "auto") -> str:
    """The device a stage computes on: "auto" is cuda when a GPU is visible, else cpu.

    Decided without initialising CUDA in this process (a lease may still narrow
    CUDA_VISIBLE_DEVICES, which CUDA reads once, at initialisation).
    """
    check_device(name)
    if name != "auto":
        return name
    return "cuda" if visible_devices() else "cpu"


@contextlib.contextmanager
def lease_device(n: int = 1, root: str | None = None, device_count: int | None = None,
                 timeout_s: float | None = None, poll_s: float = 0.5) -> Iterator[list[int] | str]:
    """Hold ``n`` GPUs exclusively for the duration of the block.

    Yields the leased positions in the visible device list (use ``cuda:<i>`` in a
    process whose CUDA was already initialized; a fresh subprocess sees only the
    leased GPUs, as ``cuda:0..n-1``, through CUDA_VISIBLE_DEVICES, which is set for
    the block and restored after). With no GPU (or n == 0) it is a no-op yielding
    ``"cpu"``. ``device_count`` overrides discovery (positions 0..count-1). When
    all devices are held it waits, polling, up to ``timeout_s`` (None: forever).
    """
    physical = [str(i) for i in range(device_count)] if device_count is not None else visible_devices()
    if n == 0 or not physical:
        yield "cpu"
        return
    if n > len(physical):
        raise InputError(f"lease of {n} GPU(s) asked, but only {len(physical)} visible ({','.join(physical)}); "
                         "lower the request or the pool's pool_slots")
    lock_dir = Path(root or default_lease_root())
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    held: list[tuple[int, object]] = []
    waited = False
    while True:
        for pos, dev in enumerate(physical):
            f = open(lock_dir / f"gpu-{dev}.lock", "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            held.append((pos, f))
            if len(held) == n:
                break
        if len(held) == n:
            break
        # Not enough free: give back what we hold (no hold-and-wait deadlock), then retry.
        for _, f in held:
            f.close()
        held = []
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no {n} free GPU(s) among {physical} after {timeout_s} s (locks in {lock_dir})")
        if not waited:
            log.info("all GPUs leased (locks in %s); waiting", lock_dir)
            waited = True
        time.sleep(poll_s)
    positions = [pos for pos, _ in held]
    for pos, f in held:  # who holds what, for people debugging a stuck pool
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(physical[p] for p in positions)
    log.info("leased GPU(s) %s", os.environ["CUDA_VISIBLE_DEVICES"])
    try:
        yield positions
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old
        for _, f in held:
            f.close()  # closing the last descriptor drops the flock
