"""The fused pieces of the training step against their unfused references (forward and gradients).

- eagle3/draft/loss.py `head_soft_ce` (lm_head + soft CE, blocked, gradients in forward) vs `soft_ce_reference`;
- eagle3/draft/argmax.py `in_draft_mask(fast=True)` (bf16 certified in fp32) vs the fp32 argmax;
- eagle3/draft/flash.py (torch's CPU flash kernel + lse merge) vs attention.py's blockwise kernel.
"""

from __future__ import annotations

import pytest
import torch

from eagle3 import memory
from eagle3.draft import argmax, loss
from eagle3.draft.attention import sample_starts, ttt_attention, window_starts
from eagle3.draft.flash import segments
from eagle3.draft.ttt import positions_in_sample


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-12))


def _loss_case(b, n, h, vd, mask, autocast, fn, scale=0.37, device="cpu"):
    torch.manual_seed(0)
    x = torch.randn(b, n, h, device=device, requires_grad=True)
    w = (torch.randn(vd, h, device=device) * 0.3).requires_grad_()
    probs = torch.randn(b, n, vd, device=device).mul(2).softmax(-1)
    top = probs.argmax(-1)
    mask = mask.to(device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
        total, correct = fn(x, w, probs, top, mask)
    (scale * total).backward()
    return float(total.detach()), int(correct), x.grad, w.grad


def _masks(b, n):
    g = torch.Generator().manual_seed(1)
    run = torch.zeros(b, n, dtype=torch.bool)
    run[:, 5:n - 3] = True
    return {"all": torch.ones(b, n, dtype=torch.bool), "one run": run,
            "random": torch.rand(b, n, generator=g) < 0.6, "none": torch.zeros(b, n, dtype=torch.bool)}


@pytest.mark.parametrize("b", [1, 2])
@pytest.mark.parametrize("which", ["all", "one run", "random", "none"])
def test_head_soft_ce_matches_reference_fp32(monkeypatch, b, which):
    # Tiny blocks and chunks: several of each, and a last one that is short.
    monkeypatch.setattr(memory, "LOSS_BLOCK_BYTES", 7 * 300 * 4)
    monkeypatch.setattr(memory, "LOSS_CHUNK_BYTES", 3 * 300 * 4)
    mask = _masks(b, 40)[which]
    ref = _loss_case(b, 40, 16, 300, mask, False, loss.soft_ce_reference)
    got = _loss_case(b, 40, 16, 300, mask, False, loss.head_soft_ce)
    assert got[0] == pytest.approx(ref[0], rel=1e-5, abs=1e-5)
    assert got[1] == ref[1]
    if which == "none":
        assert float(got[2].abs().max()) == 0 and float(got[3].abs().max()) == 0
    else:
        assert _rel(got[2], ref[2]) < 1e-5 and _rel(got[3], ref[3]) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("autocast", [False, True])
def test_head_soft_ce_matches_reference_on_a_gpu_in_its_blocks(autocast):
    # 2 x 3000 rows at Vd 32000: the GPU's blocks (eagle3/memory.py block_sizes) hold 1,048 fp32 rows, so several
    # run, each one elementwise chunk, and the last one is short.
    mask = _masks(2, 3000)["random"]
    ref = _loss_case(2, 3000, 256, 32000, mask, autocast, loss.soft_ce_reference, device="cuda")
    got = _loss_case(2, 3000, 256, 32000, mask, autocast, loss.head_soft_ce, device="cuda")
    assert got[0] == pytest.approx(ref[0], rel=1e-4 if autocast else 1e-5)
    assert got[1] == ref[1]
    assert _rel(got[2], ref[2]) < (2e-2 if autocast else 1e-4) and _rel(got[3], ref[3]) < (2e-2 if autocast else 1e-4)


@pytest.mark.parametrize("which", ["all", "random"])
def test_head_soft_ce_matches_reference_bf16_autocast(which):
    mask = _masks(2, 64)[which]
    ref = _loss_case(2, 64, 32, 500, mask, True, loss.soft_ce_reference)
    got = _loss_case(2, 64, 32, 500, mask, True, loss.head_soft_ce)
    assert got[0] == pytest.approx(ref[0], rel=1e-4)  # the same bf16 logits, fp32 statistics both ways
    assert got[1] == ref[1]
    assert _rel(got[2], ref[2]) < 2e-2 and _rel(got[3], ref[3]) < 2e-2  # bf16 gradients, rounded in another order
    assert got[3].dtype == torch.float32


def test_head_soft_ce_no_grad_and_cast_cache():
    torch.manual_seed(0)
    x, w = torch.randn(1, 8, 16), torch.randn(50, 16)
    probs = torch.randn(1, 8, 50).softmax(-1)
    mask = torch.ones(1, 8, dtype=torch.bool)
    with torch.no_grad():
        total, _ = loss.head_soft_ce(x, w, probs, probs.argmax(-1), mask)
    assert float(total) == pytest.approx(float(loss.soft_ce_reference(x, w, probs, probs.argmax(-1), mask)[0]), rel=1e-5)
    first = loss.cast_cached(w, torch.bfloat16)
    assert loss.cast_cached(w, torch.bfloat16) is first  # one cast while unchanged
    w.add_(1.0)  # an optimizer step: a new version, a new cast
    again = loss.cast_cached(w, torch.bfloat16)
    assert again is not first and torch.equal(again, w.to(torch.bfloat16))


def test_in_draft_mask_fast_equals_fp32_argmax():
    torch.manual_seed(0)
    v, h = 3000, 64
    w = torch.randn(v, h) * 0.05
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[torch.randperm(v)[:500]] = True
    x = torch.randn(700, h) * torch.rand(700, 1) * 3
    want = t2d[(x @ w.T).argmax(-1)]
    assert torch.equal(argmax.in_draft_mask(x, w, t2d, fast=True, chunk=128), want)
    assert torch.equal(argmax.in_draft_mask(x, w, t2d, fast=False, chunk=128), want)


def test_in_draft_mask_near_tie_below_bf16_resolution():
    # Two entries 1e-4 apart (bf16 rounds them alike, fp32 does not): the fp32 decision is kept, both ways round.
    h = 32
    x = torch.ones(2, h) / h ** 0.5
    base = torch.randn(10, h) * 0.01
    w = torch.cat([base, (x[0] * 4).expand(2, h).clone()])  # rows 10 and 11 score 4.0
    w[10] += 1e-4 * x[0]
    w[11] -= 1e-4 * x[0]
    t2d = torch.zeros(12, dtype=torch.bool)
    t2d[10] = True  # the fp32 argmax (row 10) is in the draft, its bf16 twin (11) is not
    assert bool((x @ w.to(torch.bfloat16).float().T)[0, 10] == (x @ w.to(torch.bfloat16).float().T)[0, 11])
    assert argmax.in_draft_mask(x, w, t2d, fast=True).tolist() == [True, True]
    t2d = ~t2d
    assert argmax.in_draft_mask(x, w, t2d, fast=True).tolist() == [False, False]


@pytest.mark.parametrize("top, second", [(290, 5), (5, 290), (130, 131), (299, 256)])
def test_in_draft_mask_finds_the_maximum_in_a_block_or_the_tail(top, second):
    # V = 300: two blocks of VOCAB_BLOCK = 128 entries and a tail of 44. The runner-up is within bf16's
    # error of the maximum, so both are candidates, wherever they sit; only the fp32 maximum is in the draft.
    assert argmax.VOCAB_BLOCK == 128
    h, v = 32, 300
    x = torch.ones(3, h) / h ** 0.5
    w = torch.randn(v, h) * 0.01
    w[top] = x[0] * 4 + 1e-4 * x[0]
    w[second] = x[0] * 4 - 1e-4 * x[0]
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[top] = True
    assert argmax.in_draft_mask(x, w, t2d, fast=True).tolist() == [True] * 3
    assert argmax.in_draft_mask(x, w, ~t2d, fast=True).tolist() == [False] * 3


def test_in_draft_mask_falls_back_when_the_bound_is_loose(monkeypatch):
    torch.manual_seed(0)
    w, x = torch.randn(400, 16), torch.randn(50, 16)
    t2d = torch.rand(400) < 0.3
    monkeypatch.setattr(argmax, "MAX_CANDIDATES", 0)  # every chunk takes the fp32 product
    assert torch.equal(argmax.in_draft_mask(x, w, t2d, fast=True), t2d[(x @ w.T).argmax(-1)])
    x[3] = float("nan")  # a row without candidates: the fp32 argmax (index of the NaN), no crash
    monkeypatch.setattr(argmax, "MAX_CANDIDATES", 64)
    assert argmax.in_draft_mask(x, w, t2d, fast=True).shape == (50,)


def _attention_grads(kernel, dtype, n_diag, seg, nh=6, nkv=2, hd=16):
    torch.manual_seed(0)
    b, t = seg.shape
    starts = sample_starts(positions_in_sample(seg))
    q = torch.randn(b, nh, t, hd, dtype=dtype, requires_grad=True)
    ks = [torch.randn(b, nkv, t, hd, dtype=dtype, requires_grad=True) for _ in range(n_diag + 1)]
    vs = [torch.randn(b, nkv, t, hd, dtype=dtype, requires_grad=True) for _ in range(n_diag + 1)]
    block = 8 if kernel == "blocks" else None
    out = ttt_attention(q, ks[0], vs[0], starts, ks[1:], vs[1:], block=block, kernel=kernel)
    out.backward(torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(2)))
    return [out.detach(), q.grad, *[k.grad for k in ks], *[v.grad for v in vs]]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("n_diag", [0, 1, 6])
def test_flash_kernel_matches_blockwise(dtype, tol, n_diag):
    seg = torch.tensor([[1] * 10 + [2] * 20 + [3] * 7, [1] * 30 + [0] * 7])  # packed samples, padding
    ref = _attention_grads("blocks", dtype, n_diag, seg)
    got = _attention_grads("flash", dtype, n_diag, seg)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and _rel(a, b) < tol


def test_flash_segments_only_for_sample_starts():
    seg = torch.tensor([[1] * 5 + [2] * 3, [1] * 8])
    starts = sample_starts(positions_in_sample(seg))
    assert segments(starts) == [(0, 0, 5), (0, 5, 8), (1, 0, 8)]
    assert segments(window_starts(starts, 2)) is None  # a sliding window: the blockwise kernel
    q, k = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="flash kernel needs"):
        ttt_attention(q[:, :, 2:], k, k, starts[:1, 2:], q_offset=2, kernel="flash")
