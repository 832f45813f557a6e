"""Typed errors shared by all stages, their process exit codes, and the OOM test.

This module imports nothing heavy (no torch): the Airflow DAG processor
resolves these classes at parse time for the retry policy, and the operators map
a supervised child's exit code back to the class here.
"""

from __future__ import annotations

import sys


class Eagle3Error(Exception):
    """Base class of every error this package raises on purpose."""

    #: exit code of `eagle3 <stage>` when this error ends it
    EXIT_CODE = 1


class InputError(Eagle3Error):
    """Bad user input (file, manifest, parameter). Retrying cannot fix it."""

    EXIT_CODE = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None):
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        super().__init__(where + message)
        self.file = file
        self.line = line


class DamagedFile(InputError, ValueError):
    """An artifact that does not parse (truncated, damaged or not what its name says). Still a ValueError, so a
    caller that treats an unreadable file as absent (a cache marker) can."""


class GateFailed(Eagle3Error):
    """A verification gate refused its input (e.g. speculative output != greedy output). Retrying cannot fix it."""

    EXIT_CODE = 3


class GpuOutOfMemory(Eagle3Error):
    """A GPU (or injected) out-of-memory; the state was saved with a smaller
    micro-batch, so a retry resumes and should succeed."""

    EXIT_CODE = 75  # EX_TEMPFAIL: try again


_BY_EXIT_CODE = {cls.EXIT_CODE: cls for cls in (InputError, GateFailed, GpuOutOfMemory)}


def exit_code(exc: BaseException) -> int:
    """The exit code a stage process ends with after ``exc``."""
    return getattr(exc, "EXIT_CODE", 1) if isinstance(exc, Eagle3Error) else 1


def error_for_exit(code: int, message: str) -> Exception:
    """The error a supervisor raises for a child that exited with ``code`` (a plain RuntimeError when the
    code names no error class: the retry policy then treats it as transient)."""
    cls = _BY_EXIT_CODE.get(code)
    return cls(message) if cls is not None else RuntimeError(message)


def is_oom(exc: BaseException) -> bool:
    """A CUDA (or injected) out-of-memory error: torch.OutOfMemoryError, or a RuntimeError saying so."""
    torch = sys.modules.get("torch")  # an OOM can only come from torch once it is imported
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)
