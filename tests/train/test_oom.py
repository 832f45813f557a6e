"""OOM recognition, fault injector, halving rule."""

from __future__ import annotations

import pytest
import torch

from eagle3 import errors, oom
from eagle3.errors import InputError
from eagle3.oom import halve


def test_recognises_torch_oom_and_cuda_runtime_error_only():
    assert errors.is_oom(torch.OutOfMemoryError("x"))
    assert errors.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not errors.is_oom(RuntimeError("shape mismatch"))
    assert not errors.is_oom(ValueError("CUDA out of memory"))


def test_injector_raises_only_above_limit(monkeypatch):
    monkeypatch.setenv(oom.INJECT_ENV, "100")
    oom.maybe_inject(100)
    with pytest.raises(torch.OutOfMemoryError):
        oom.maybe_inject(101)
    monkeypatch.setenv(oom.INJECT_ENV, "lots")
    with pytest.raises(InputError, match=oom.INJECT_ENV):
        oom.maybe_inject(1)
    monkeypatch.delenv(oom.INJECT_ENV)
    oom.maybe_inject(10**9)


def test_halve_keeps_effective_batch_and_refuses_below_one_sample():
    assert halve(4096, 2, longest_sample=512) == (2048, 4)
    # half of 12K would not hold an 8K sample: one sample's budget instead (it used to refuse here)
    assert halve(12288, 1, longest_sample=8192) == (8192, 2)
    assert halve(600, 1, longest_sample=512) == (512, 2)
    with pytest.raises(InputError, match=r"holds just the longest sample \(512 tokens\).*max-seq-len"):
        halve(512, 2, longest_sample=512)
