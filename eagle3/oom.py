"""Out-of-memory fault injection, so the OOM → save → retry → resume path runs on CPU too.

``EAGLE3_INJECT_OOM_ABOVE_TOKENS=N`` makes any forward over more than N (padded)
tokens raise ``torch.OutOfMemoryError``, in extraction and in training alike.
Recognising a real OOM is :func:`eagle3.errors.is_oom`.
"""

from __future__ import annotations

import os

from eagle3.errors import InputError

INJECT_ENV = "EAGLE3_INJECT_OOM_ABOVE_TOKENS"


def inject_limit() -> int | None:
    raw = os.environ.get(INJECT_ENV)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"environment variable {INJECT_ENV}={raw!r} is not an integer token count") from None


def maybe_inject(tokens: int, what: str = "batch") -> None:
    """Raise torch.OutOfMemoryError when the fault injector says a ``what`` of ``tokens`` is too big."""
    limit = inject_limit()
    if limit is not None and tokens > limit:
        import torch

        raise torch.OutOfMemoryError(f"injected by {INJECT_ENV}={limit}: {what} of {tokens} tokens (CUDA out of memory)")
