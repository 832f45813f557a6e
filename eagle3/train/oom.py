"""GPU out-of-memory: recognise it, inject it on CPU, and adapt the batch.

When a micro-batch runs out of memory the trainer saves its state with half
the micro-batch token budget and twice the gradient accumulation (so the
optimizer step sees the same effective batch and the loss curve is unchanged),
then raises :class:`eagle3.errors.GpuOutOfMemory`. The CLI turns that into exit
code 75, which the Airflow task retries; the retry resumes from the checkpoint
with the smaller micro-batch.

``EAGLE3_INJECT_OOM_ABOVE_TOKENS=N`` makes any micro-batch of more than N
(padded) tokens raise ``torch.OutOfMemoryError``, so the whole path is
testable on CPU.
"""

from __future__ import annotations

import os

from eagle3.errors import InputError

INJECT_ENV = "EAGLE3_INJECT_OOM_ABOVE_TOKENS"


def is_oom(exc: BaseException) -> bool:
    """True for torch.OutOfMemoryError and RuntimeErrors that report a CUDA OOM."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def inject_limit() -> int | None:
    raw = os.environ.get(INJECT_ENV)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"environment variable {INJECT_ENV}={raw!r} is not an integer token count") from None


def maybe_inject(tokens: int) -> None:
    """Raise torch.OutOfMemoryError when the fault injector says this micro-batch is too big."""
    limit = inject_limit()
    if limit is not None and tokens > limit:
        import torch

        raise torch.OutOfMemoryError(
            f"injected by {INJECT_ENV}={limit}: micro-batch of {tokens} tokens (CUDA out of memory)"
        )


def halve(micro_batch_tokens: int, grad_accum: int, longest_sample: int) -> tuple[int, int]:
    """The next (micro_batch_tokens, grad_accum) after an OOM; same product.

    Refuses (InputError, not retried) when the micro-batch is already down to
    one sample: halving cannot help then, only shorter samples can.
    """
    if micro_batch_tokens // 2 < max(longest_sample, 1):
        raise InputError(
            f"out of memory with a micro-batch of {micro_batch_tokens} tokens, and halving it would go below "
            f"the longest sample ({longest_sample} tokens); merge with a smaller --max-seq-len or use a bigger GPU"
        )
    return micro_batch_tokens // 2, grad_accum * 2
