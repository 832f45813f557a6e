"""How training adapts after an out-of-memory.

When a micro-batch runs out of memory the trainer saves its state with half
the micro-batch token budget and twice the gradient accumulation (so the
optimizer step sees the same effective batch and the loss curve is unchanged),
then raises :class:`eagle3.errors.GpuOutOfMemory`. The CLI turns that into exit
code 75, which the Airflow task retries; the retry resumes from the checkpoint
with the smaller micro-batch. Injection for CPU tests: :mod:`eagle3.oom`.
"""

from __future__ import annotations

from eagle3.errors import InputError


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
