"""Typed errors shared by all stages.

This module imports nothing heavy (no torch): the Airflow DAG processor
resolves these classes at parse time for the retry policy.
"""

from __future__ import annotations


class Eagle3Error(Exception):
    """Base class of every error this package raises on purpose."""


class InputError(Eagle3Error):
    """Bad user input (file, manifest, parameter). Retrying cannot fix it."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None):
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        super().__init__(where + message)
        self.file = file
        self.line = line


class GateFailed(Eagle3Error):
    """A verification gate refused its input. Retrying cannot fix it."""


class GpuOutOfMemory(Eagle3Error):
    """A GPU (or injected) out-of-memory; the state was saved with a smaller
    micro-batch, so a retry resumes and should succeed."""

    #: process exit code a supervised subprocess uses to report this error
    EXIT_CODE = 75
