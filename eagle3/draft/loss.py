"""The TTT step's loss: the draft lm_head and the soft cross-entropy over the draft vocab, fused and blocked.

For the masked rows r of a step (eagle3/draft/ttt.py), with z_r = h_r W^T the draft-vocab logits and p_r the
target's probabilities:

    ce_r    = -sum_v p_rv log_softmax(z_r)_v = lse(z_r) * sum_v p_rv - p_r . z_r
    d ce_r / d z_r = softmax(z_r) * sum_v p_rv - p_r

`soft_ce_reference` is that written as autograd sees it (the definition, and the oracle of
tests/draft/test_fused_loss.py). `head_soft_ce` computes the same sum, the argmax hits and, where a gradient is
wanted, the gradients of h and W in its forward, a block of rows at a time: the [rows, Vd] logits, their fp32
copy, the log-softmax and its gradient are never whole tensors (the reference's are, 33 MB each at T=1024,
Vd=8192: above glibc's 32 MiB mmap ceiling, so every one of them is a fresh mapping whose pages fault on first
touch), and the elementwise work runs on cache-sized chunks in two passes (max + exp-sum, then the gradient).
The loss is a scalar, so its backward only scales the saved gradients. Rows outside the mask are skipped: their
logits are never computed. Under bf16 autocast the products run in bf16 as autocast's would (bf16 logits, bf16
gradient of the logits); the softmax statistics and W's gradient accumulate in fp32.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from eagle3.memory import block_sizes  # the blocks are a memory fact: eagle3/memory.py sizes them


def soft_ce_reference(h: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, top: torch.Tensor,
                      mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over masked rows of the soft CE, masked rows whose draft argmax equals ``top``), unfused.

    h [B,N,H] (the normed hidden the lm_head reads), weight [Vd,H], probs [B,N,Vd], top [B,N], mask [B,N]."""
    logits = F.linear(h, weight)
    ce = -(probs * F.log_softmax(logits.float(), -1)).sum(-1)
    return (ce * mask).sum(), ((logits.argmax(-1) == top) & mask).sum()


@torch.compiler.disable  # data-dependent row selection and a block loop: compiled callers run it eagerly
def head_soft_ce(h: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, top: torch.Tensor,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`soft_ce_reference`, fused (see the module docstring); the same arguments and results.

    The compute dtype is autocast's where autocast is on for h's device (the weight is cast once), else h's."""
    dev = h.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    return _HeadSoftCE.apply(h, weight, probs, top, mask, dtype)


_DERIVED: dict = {}


def derived(w: torch.Tensor, key, fn):
    """``fn(w)``, computed once while ``w`` lives unchanged (its version counter; an optimizer step bumps it),
    one entry per ``key``: what a fixed or once-per-step tensor's users derive from it again and again."""
    hit = _DERIVED.get(key)
    if hit is None or hit[0]() is not w or hit[1] != w._version:
        with torch.no_grad():
            hit = (weakref.ref(w, lambda _: _DERIVED.pop(key, None)), w._version, fn(w))
        _DERIVED[key] = hit
    return hit[2]


def cast_cached(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``w.to(dtype)`` via `derived`: the TTT steps of a micro-batch share one cast of the lm_head (autocast
    caches its own weight casts the same way)."""
    return w if w.dtype == dtype else derived(w, ("cast", dtype), lambda x: x.to(dtype))


def _blocks(n: int, width: int, item: int, budget: int) -> int:
    return max(1, min(n, budget // max(1, width * item)))


class _HeadSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, probs, top, mask, dtype):
        b, n = mask.shape
        vd = weight.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        rows_b, rows_t = mask.nonzero(as_tuple=True)
        # One row whose trained positions are one run (the bench, a single assistant turn): views, no gathers.
        lo = int(rows_t[0]) if len(rows_t) else 0
        whole = b == 1 and (len(rows_t) == 0 or int(rows_t[-1]) - lo + 1 == len(rows_t))
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        correct = torch.zeros((), dtype=torch.int64, device=h.device)
        dh = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if want_h else None
        dw = None
        ctx.h_dtype, ctx.w_dtype = h.dtype, weight.dtype
        with torch.autocast(h.device.type, enabled=False):
            w = cast_cached(weight, dtype)
            block_bytes, chunk_bytes = block_sizes(h.device.type)
            block = _blocks(len(rows_t), vd, probs.element_size(), block_bytes)
            chunk = _blocks(block, vd, 4, chunk_bytes)
            for r0 in range(0, len(rows_t), block):
                r1 = min(len(rows_t), r0 + block)
                if whole:
                    hb, pb, tb = h[0, lo + r0:lo + r1].to(dtype), probs[0, lo + r0:lo + r1], top[0, lo + r0:lo + r1]
                else:
                    ib, it = rows_b[r0:r1], rows_t[r0:r1]
                    hb, pb, tb = h[ib, it].to(dtype), probs[ib, it], top[ib, it]
                z = hb @ w.T  # [rows, Vd] in the compute dtype, as autocast's lm_head
                gz = torch.empty_like(z) if (want_h or want_w) else None
                for c0 in range(0, r1 - r0, chunk):
                    c1 = min(r1 - r0, c0 + chunk)
                    zf, pc = z[c0:c1].float(), pb[c0:c1]
                    m, arg = zf.max(-1)
                    correct += (arg == tb[c0:c1]).sum()
                    psum = pc.sum(-1)
                    total -= torch.dot(pc.reshape(-1), zf.view(-1))  # sum_r p_r . z_r: one BLAS dot, no temporary
                    e = zf.sub_(m[:, None]).exp_()
                    s = e.sum(-1)
                    total += (psum * (m + s.log())).sum()
                    if gz is not None:  # softmax * sum(p) - p
                        gz[c0:c1] = e.mul_((psum / s)[:, None]).sub_(pc)
                if want_h:
                    dhb = (gz @ w).float()
                    if whole:
                        dh[0, lo + r0:lo + r1] = dhb
                    else:
                        dh[ib, it] = dhb
                if want_w:
                    part = (gz.T @ hb).float()
                    dw = part if dw is None else dw.add_(part)
        if want_w and dw is None:
            dw = torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
        ctx.mark_non_differentiable(correct)
        ctx.save_for_backward(dh, dw)
        return total, correct

    @staticmethod
    def backward(ctx, g_total, _g_correct):
        dh, dw = ctx.saved_tensors
        grad_h = (dh * g_total).to(ctx.h_dtype) if dh is not None else None
        grad_w = (dw * g_total).to(ctx.w_dtype) if dw is not None else None
        return grad_h, grad_w, None, None, None, None
