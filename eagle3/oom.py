"""After an out-of-memory: the one halving policy (extraction and training), and fault injection, so the
OOM → save → retry → resume path runs on CPU too.

Extraction and training both halve their token budget after an OOM and exit 75, which the Airflow task
retries; the retry resumes with the halved budget (training doubles its gradient accumulation, so the
optimizer step sees the same batch). Neither goes below one sample of the longest length: halving cannot
help then, and an extraction that halved down to 1 token would burn every retry.

``EAGLE3_INJECT_OOM_ABOVE_TOKENS=N`` makes any forward over more than N (padded)
tokens raise ``torch.OutOfMemoryError``, in extraction and in training alike.
Recognising a real OOM is :func:`eagle3.errors.is_oom`.
"""

from __future__ import annotations

import os

from eagle3.errors import InputError

INJECT_ENV = "EAGLE3_INJECT_OOM_ABOVE_TOKENS"


def halved_budget(tokens: int, longest_sample: int, fix: str) -> int:
    """The token budget after an out-of-memory at ``tokens``: half of it, or one sample of ``longest_sample``
    tokens where half would not hold one (12K with 8K samples: 8K). At one such sample already it refuses
    (InputError, not retried): a smaller budget cannot help. ``fix`` says what would help instead."""
    one = max(longest_sample, 1)
    if tokens <= one:
        raise InputError(f"out of memory with a budget of {tokens} tokens, which holds just the longest sample "
                         f"({longest_sample} tokens): a smaller budget cannot help; {fix}")
    return max(tokens // 2, one)


def halve(micro_batch_tokens: int, grad_accum: int, longest_sample: int) -> tuple[int, int]:
    """Training's next (micro_batch_tokens, grad_accum) after an OOM: about the same product (the effective batch
    itself is the saved global_tokens, whatever the accumulation says)."""
    micro = halved_budget(micro_batch_tokens, longest_sample,
                          "merge with a smaller --max-seq-len, checkpoint the TTT steps, or use a bigger GPU")
    return micro, -(-micro_batch_tokens * grad_accum // micro)


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
