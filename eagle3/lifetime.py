"""Processes that die with the process that started them (Linux's parent-death signal, prctl PR_SET_PDEATHSIG).

Stages start long-lived children in sessions of their own, so that one signal to the group stops them and their
workers: the CLI under the Airflow task (operators/supervised.py), an inference server under the CLI
(eagle3/serving/process.py), torchrun's workers. A new session also takes them out of reach of whatever kills
the parent's group. When the parent is SIGKILLed (Airflow's escalation 5 s after SIGTERM, the kernel's OOM
killer), nothing would stop them: a server would keep the GPU memory a retry needs, a CLI its GPU lease. The
kernel sends `SIGNAL` instead. Elsewhere than on Linux these do nothing.
"""

from __future__ import annotations

import os
import signal

SIGNAL = signal.SIGTERM
"""What the orphan receives: a graceful stop (a server stops its own workers, the CLI leaves through its
`finally` blocks)."""
_PR_SET_PDEATHSIG = 1


def _prctl():
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent() -> None:
    """This process gets `SIGNAL` when its parent exits; if the parent is already gone, it gets it now."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, int(SIGNAL))
    if os.getppid() == 1:  # the parent was gone before the call
        os.kill(os.getpid(), SIGNAL)


def parent_death_preexec():
    """A Popen ``preexec_fn``: the child gets `SIGNAL` when the thread that started it exits (start it from a
    thread that waits for it or outlives it). Resolved here, in the parent, so the forked child only makes the
    call. None where there is no prctl."""
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(SIGNAL))
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), SIGNAL)

    return preexec
