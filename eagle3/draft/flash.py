"""The TTT attention on torch's CPU flash-attention kernel: step 0 per packed sample, the diagonal merged by lse.

Same contract as `attention.ttt_attention` (which dispatches here on the CPU when it can). Step 0 of a query
row attends the keys of its own sample causally, so each sample of each row is one causal attention:
`aten::_scaled_dot_product_flash_attention_for_cpu` computes it with its fused blocked kernel (fp32 scores,
softmax and accumulators, the products in the input dtype on the matrix engine) and returns the output and
its log-sum-exp. The later steps' keys are attended on the diagonal only (one score per row and step) and
are merged by log-sum-exp:

    L = log(exp(lse0) + sum_j exp(s_j)),   out = exp(lse0 - L) out0 + sum_j exp(s_j - L) v_j

Backward: the flash backward kernel, given the MERGED output and L instead of its own, computes the step-0
part of the merged softmax's gradient exactly (P = exp(S - L) are the merged probabilities of the step-0 keys,
and its D = rowsum(dO * O) is the merged one): the identity ring attention uses. The diagonal terms are a few
elementwise ops per step. GQA: the kernel wants as many kv heads as query heads, so k0/v0 are expanded (nh x T
x hd, small) and their gradients summed over each kv head's group.

Eligible (`segments`): q_offset 0 (no sequence-parallel slice) and starts that are sample starts (each row's
positions split into runs [s0, s1) whose start is s0; a sliding window's starts are not). Anything else runs
the blockwise kernel of attention.py.
"""

from __future__ import annotations

import torch

MAX_SEGMENTS = 256
"""Samples per micro-batch above which the per-sample kernel calls cost more than they save (blockwise then)."""


def segments(starts: torch.Tensor) -> list[tuple[int, int, int]] | None:
    """[(row, s0, s1)]: the samples of each row, from `attention.sample_starts`; None if ``starts`` are not
    sample starts (a sliding window, a malformed input) or there are more than `MAX_SEGMENTS`."""
    b, t = starts.shape
    if t == 0:
        return []
    new = torch.ones_like(starts, dtype=torch.bool)
    new[:, 1:] = starts[:, 1:] != starts[:, :-1]
    rows, cols = new.nonzero(as_tuple=True)
    if len(rows) > MAX_SEGMENTS:
        return None
    if not bool((starts[rows, cols] == cols).all()):
        return None
    out = []
    for r, c, nxt in zip(rows.tolist(), cols.tolist(), [*cols.tolist()[1:], t]):
        out.append((r, c, nxt if nxt > c else t))
    return out


def _expand(x: torch.Tensor, nh: int) -> torch.Tensor:
    """[B,nkv,T,hd] -> [B,nh,T,hd], each kv head repeated for its query heads (nh = nkv x group)."""
    b, nkv, t, hd = x.shape
    return x[:, :, None].expand(b, nkv, nh // nkv, t, hd).reshape(b, nh, t, hd)


def _group_sum(x: torch.Tensor, nkv: int) -> torch.Tensor:
    b, nh, t, hd = x.shape
    return x.view(b, nkv, nh // nkv, t, hd).sum(2)


def flash_ttt_attention(q, k0, v0, segs, diag_keys, diag_values) -> torch.Tensor:
    return _FlashTTT.apply(q, k0, v0, segs, len(diag_keys), *diag_keys, *diag_values)


class _FlashTTT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k0, v0, segs, n_diag, *diag):
        b, nh, t, hd = q.shape
        scale = hd ** -0.5
        kx, vx = _expand(k0, nh), _expand(v0, nh)
        out0 = torch.empty_like(q)
        lse = q.new_empty(b, nh, t, dtype=torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            for r, s0, s1 in segs:
                o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q[r:r + 1, :, s0:s1], kx[r:r + 1, :, s0:s1], vx[r:r + 1, :, s0:s1], 0.0, True, scale=scale)
                out0[r:r + 1, :, s0:s1] = o
                lse[r:r + 1, :, s0:s1] = l
            if n_diag:
                qf = q.float()
                s = [(qf * _expand(k, nh).float()).sum(-1) * scale for k in diag[:n_diag]]  # [B,nh,T] each
                big_l = torch.logsumexp(torch.stack([lse, *s]), 0)
                acc = out0.float() * torch.exp(lse - big_l)[..., None]
                for sj, v in zip(s, diag[n_diag:]):
                    acc += torch.exp(sj - big_l)[..., None] * _expand(v, nh).float()
                out = acc.to(q.dtype)
            else:
                big_l, out = lse, out0
        ctx.segs, ctx.n_diag = segs, n_diag
        ctx.save_for_backward(q, k0, v0, out, big_l, *diag)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k0, v0, out, big_l, *diag = ctx.saved_tensors
        n_diag, nkv = ctx.n_diag, k0.shape[1]
        b, nh, t, hd = q.shape
        scale = hd ** -0.5
        d_out = d_out.contiguous()
        kx, vx = _expand(k0, nh), _expand(v0, nh)
        dq, dkx, dvx = torch.zeros_like(q), torch.zeros_like(kx), torch.zeros_like(vx)
        with torch.autocast(q.device.type, enabled=False):
            for r, s0, s1 in ctx.segs:
                sl = (slice(r, r + 1), slice(None), slice(s0, s1))
                g = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    d_out[sl], q[sl], kx[sl], vx[sl], out[sl], big_l[sl], 0.0, True, scale=scale)
                dq[sl], dkx[sl], dvx[sl] = g
            grads_k, grads_v = [], []
            if n_diag:
                qf, dof = q.float(), d_out.float()
                big_d = (dof * out.float()).sum(-1)  # D = rowsum(dO * O), as the kernel takes it
                dqf = dq.float()
                for k, v in zip(diag[:n_diag], diag[n_diag:]):
                    kf, vf = _expand(k, nh).float(), _expand(v, nh).float()
                    p = torch.exp((qf * kf).sum(-1) * scale - big_l)
                    ds = p * ((dof * vf).sum(-1) - big_d)
                    dqf += (ds * scale)[..., None] * kf
                    grads_k.append(_group_sum((ds * scale)[..., None] * qf, nkv).to(k.dtype))
                    grads_v.append(_group_sum(p[..., None] * dof, nkv).to(v.dtype))
                dq = dqf.to(q.dtype)
        return (dq, _group_sum(dkx.float(), nkv).to(k0.dtype), _group_sum(dvx.float(), nkv).to(v0.dtype), None, None,
                *grads_k, *grads_v)
