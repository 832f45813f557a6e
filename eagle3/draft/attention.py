"""Blockwise (flash-style) TTT attention: memory O(T), time ~ T x sample length.

TTT step i's query at row position t attends (eagle3/draft/ttt.py):
  - step-0 keys s with starts[t] <= s <= t (causal, inside its own packed sample), and
  - the keys of steps 1..i at t only (the diagonal),
under one softmax. The dense path (`DraftAttention.attend` with `ttt.step0_mask`)
builds fp32 scores [B, kv heads, group, T, T] per step and autograd keeps all of
them, so a 7-step TTT forward holds 7 T x T score tensors plus their softmax.

Here the step-0 part runs over blocks of `block` queries x `block` keys with an
online softmax, merged with the diagonal scores by log-sum-exp. Only q, the keys
and values (which the TTT history holds anyway), the output and the per-row
log-sum-exp are saved; backward recomputes each block's scores (the standard
flash-attention backward, D = rowsum(dO * O)). Key blocks wholly above the
diagonal or before every row's sample start are never visited, and a mask is
built only for the blocks that straddle one of those edges. GQA: the `group`
query heads of a kv head are stacked as rows of one matmul against that kv
head's keys, so k/v are never repeated. Scores, softmax statistics and
accumulators are fp32 whatever the input dtype; outputs and gradients come back
in their inputs' dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle3.draft.flash import flash_ttt_attention, segments

KERNELS = ("auto", "flash", "blocks")

DEFAULT_BLOCK = 512
"""Queries and keys per block. SmolLM2's draft shape at T=4096, TTT step 7, one CPU thread: 128, 256 and 512
within 15% of each other (1.6-1.8 CPU-s forward+backward, the dense path 9.3), 1024 slower (2.3); 512 halves
the Python iterations of 256, which matters more where kernels are fast (CUDA)."""


def sample_starts(positions: torch.Tensor) -> torch.Tensor:
    """[B,T] row index at which each position's sample begins, from `ttt.positions_in_sample`."""
    return torch.arange(positions.shape[1], device=positions.device) - positions


def window_starts(starts: torch.Tensor, window: int) -> torch.Tensor:
    """Sample starts narrowed to a sliding window: row t sees keys t-window+1..t of its sample (0: unchanged).
    The block plan then skips key blocks before every row's window, so time is ~ T x window."""
    if not window:
        return starts
    return torch.maximum(starts, torch.arange(starts.shape[1], device=starts.device) - (window - 1))


@torch.compiler.disable  # the block plan is host code over the data (`tolist`); compiled callers run it eagerly
def ttt_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, starts: torch.Tensor,
                  diag_keys=(), diag_values=(), block: int | None = None, q_offset: int = 0,
                  kernel: str = "auto", q_pos: torch.Tensor | None = None) -> torch.Tensor:
    """Step-0 keys causal within the sample plus diagonal-only later keys; [B,nh,Tq,hd] in q's dtype.

    q [B,nh,Tq,hd]; k0/v0 [B,nkv,T,hd] (nh a multiple of nkv); starts [B,Tq] int
    (`sample_starts`: key index where each query row's sample begins); each diag key/value
    [B,nkv,Tq,hd] pairs only with its own row. Query row r sits at key position r + ``q_offset``
    (a sequence-parallel rank's slice of the rows, eagle3/draft/sequence.py; 0: Tq = T), or at ``q_pos`` [B,Tq]
    (non-decreasing along each row: the positions a TTT step gathered, eagle3/draft/ttt.py "Sparse steps";
    blocks kernel only).
    ``kernel``: "blocks" (this module's), "flash" (eagle3/draft/flash.py: torch's CPU flash kernel per
    packed sample; CPU, q_offset 0 and sample starts only) or "auto": flash where it applies and no
    ``block`` is given, else blocks.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if len(diag_keys) != len(diag_values):
        raise ValueError(f"{len(diag_keys)} diagonal keys but {len(diag_values)} values")
    if q_pos is None and (q_offset < 0 or q_offset + q.shape[2] > k0.shape[2]):
        raise ValueError(f"query rows {q_offset}..{q_offset + q.shape[2]} outside the {k0.shape[2]} keys")
    if q_pos is not None:
        if q_offset or kernel == "flash" or tuple(q_pos.shape) != (q.shape[0], q.shape[2]):
            raise ValueError(f"q_pos must be [B, Tq] = {(q.shape[0], q.shape[2])}, with q_offset 0 and the blocks "
                             f"kernel (got {tuple(q_pos.shape)}, {q_offset}, {kernel})")
    elif kernel == "flash" or (kernel == "auto" and block is None):
        segs = segments(starts) if q.device.type == "cpu" and q_offset == 0 else None
        if segs is not None:
            return flash_ttt_attention(q, k0, v0, segs, diag_keys, diag_values)
        if kernel == "flash":
            raise ValueError("the flash kernel needs the CPU, q_offset 0 and sample starts (no sliding window)")
    block = block or DEFAULT_BLOCK
    if q_pos is None:
        q_pos = (torch.arange(q.shape[2], device=q.device) + q_offset).expand(q.shape[0], -1)
    return _TTTAttention.apply(q, k0, v0, starts, block, q_pos, len(diag_keys), *diag_keys, *diag_values)


def _plan(starts: torch.Tensor, block: int, q_pos: torch.Tensor) -> list[tuple[int, int, list[tuple[int, int, bool]]]]:
    """Per query block (r0, r1, [(c0, c1, needs_mask)]): the key blocks any of its rows may see (rows are
    local, keys global: row r of batch row b is at key position q_pos[b, r])."""
    b, t = starts.shape
    nb = -(-t // block)
    pad = nb * block - t
    far = int(q_pos.max()) + 1 if q_pos.numel() else 0
    lo = F.pad(starts, (0, pad), value=far).view(b, nb, block).amin(dim=(0, 2))
    hi = F.pad(starts, (0, pad), value=0).view(b, nb, block).amax(dim=(0, 2))
    q_lo = F.pad(q_pos, (0, pad), value=far).view(b, nb, block).amin(dim=(0, 2))
    q_hi = F.pad(q_pos, (0, pad), value=-1).view(b, nb, block).amax(dim=(0, 2))
    plan = []
    for qi, (lo_i, hi_i, g0, g_max) in enumerate(torch.stack([lo, hi, q_lo, q_hi]).T.tolist()):
        r0, r1 = qi * block, min(t, (qi + 1) * block)
        g1 = g_max + 1
        keys = [(c0, min(c0 + block, g1)) for c0 in range(lo_i, g1, block)]
        # A block needs a mask if a key lies after some row (the diagonal) or before some row's start.
        plan.append((r0, r1, [(c0, c1, c1 - 1 > g0 or c0 < hi_i) for c0, c1 in keys]))
    return plan


def _blocked(starts: torch.Tensor, q_pos: torch.Tensor, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
    """[B,1,1,rows,keys] True where row r may NOT attend key c (c after the row's position, or before its
    sample start)."""
    cols = torch.arange(c0, c1, device=starts.device)[None, None, :]
    return ((cols > q_pos[:, r0:r1, None]) | (cols < starts[:, r0:r1, None]))[:, None, None]


def _rows(x5: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows r0:r1 of a [B,nkv,g,T,hd] view as a contiguous fp32 block (the matmuls below view it as 2-D per head)."""
    return x5[:, :, :, r0:r1].float().contiguous()


class _TTTAttention(torch.autograd.Function):
    """Inputs (q, k0, v0, starts, block, q_pos, n, *diag_keys[n], *diag_values[n]); see `ttt_attention`."""

    @staticmethod
    def forward(ctx, q, k0, v0, starts, block, q_pos, n_diag, *diag):
        b, nh, t, hd = q.shape
        nkv = k0.shape[1]
        g, scale = nh // nkv, hd ** -0.5
        out = torch.empty_like(q)
        lse = q.new_empty(b, nkv, g, t, dtype=torch.float32)
        q5, o5 = q.view(b, nkv, g, t, hd), out.view(b, nkv, g, t, hd)
        d_k, d_v = diag[:n_diag], diag[n_diag:]
        with torch.autocast(q.device.type, enabled=False):  # fp32 math under bf16 autocast too
            for r0, r1, keys in _plan(starts, block, q_pos):
                n = r1 - r0
                qb = _rows(q5, r0, r1) * scale  # [B,nkv,g,n,hd]
                if n_diag:
                    s = torch.stack([(qb * k[:, :, None, r0:r1].float()).sum(-1) for k in d_k], -1)
                    m = s.amax(-1)
                    p = torch.exp(s - m[..., None])
                    l = p.sum(-1)
                    acc = sum(p[..., j, None] * v[:, :, None, r0:r1].float() for j, v in enumerate(d_v))
                else:
                    m = qb.new_full((b, nkv, g, n), float("-inf"))
                    l, acc = torch.zeros_like(m), torch.zeros_like(qb)
                q2 = qb.view(b, nkv, g * n, hd)
                for c0, c1, masked in keys:
                    s = (q2 @ k0[:, :, c0:c1].float().transpose(-1, -2)).view(b, nkv, g, n, c1 - c0)
                    if masked:
                        s.masked_fill_(_blocked(starts, q_pos, r0, r1, c0, c1), float("-inf"))
                    m_new = torch.maximum(m, s.amax(-1))
                    # A row all masked so far has m_new = -inf; a 0 base keeps exp() at 0 instead of nan.
                    base = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                    p = s.sub_(base[..., None]).exp_()  # in place: the block's scores are not needed again
                    alpha = torch.exp(m - base)
                    l = l.mul_(alpha).add_(p.sum(-1))
                    pv = p.view(b, nkv, g * n, c1 - c0) @ v0[:, :, c0:c1].float()
                    acc = acc.mul_(alpha[..., None]).add_(pv.view(b, nkv, g, n, hd))
                    m = m_new
                o5[:, :, :, r0:r1] = (acc / l[..., None]).to(out.dtype)
                lse[..., r0:r1] = m + torch.log(l)
        ctx.save_for_backward(q, k0, v0, starts, q_pos, out, lse, *diag)
        ctx.block, ctx.n_diag = block, n_diag
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k0, v0, starts, q_pos, out, lse, *diag = ctx.saved_tensors
        n_diag = ctx.n_diag
        d_k, d_v = diag[:n_diag], diag[n_diag:]
        b, nh, t, hd = q.shape
        nkv = k0.shape[1]
        g, scale = nh // nkv, hd ** -0.5
        q5, o5 = q.view(b, nkv, g, t, hd), out.view(b, nkv, g, t, hd)
        do5 = d_out.reshape(b, nkv, g, t, hd)
        dq = torch.empty_like(q)
        dq5 = dq.view(b, nkv, g, t, hd)
        dk0 = torch.zeros(k0.shape, dtype=torch.float32, device=k0.device)
        dv0 = torch.zeros(v0.shape, dtype=torch.float32, device=v0.device)
        ddk, ddv = [torch.empty_like(k) for k in d_k], [torch.empty_like(v) for v in d_v]
        with torch.autocast(q.device.type, enabled=False):
            for r0, r1, keys in _plan(starts, ctx.block, q_pos):
                n = r1 - r0
                qb = _rows(q5, r0, r1) * scale
                dob = _rows(do5, r0, r1)
                big_d = (dob * o5[:, :, :, r0:r1].float()).sum(-1)  # D = rowsum(dO * O)
                lse_b = lse[..., r0:r1]
                dqb = torch.zeros_like(qb)
                for j in range(n_diag):
                    kb, vb = d_k[j][:, :, None, r0:r1].float(), d_v[j][:, :, None, r0:r1].float()
                    p = torch.exp((qb * kb).sum(-1) - lse_b)
                    ds = p * ((dob * vb).sum(-1) - big_d)
                    dqb += ds[..., None] * kb
                    ddk[j][:, :, r0:r1] = (ds[..., None] * qb).sum(2).to(ddk[j].dtype)
                    ddv[j][:, :, r0:r1] = (p[..., None] * dob).sum(2).to(ddv[j].dtype)
                q2, do2 = qb.view(b, nkv, g * n, hd), dob.view(b, nkv, g * n, hd)
                dq2 = dqb.view(b, nkv, g * n, hd)
                for c0, c1, masked in keys:
                    kb, vb = k0[:, :, c0:c1].float(), v0[:, :, c0:c1].float()
                    s = (q2 @ kb.transpose(-1, -2)).view(b, nkv, g, n, c1 - c0)
                    if masked:
                        s.masked_fill_(_blocked(starts, q_pos, r0, r1, c0, c1), float("-inf"))
                    p = s.sub_(lse_b[..., None]).exp_()
                    dp = (do2 @ vb.transpose(-1, -2)).view(b, nkv, g, n, c1 - c0)
                    ds = dp.sub_(big_d[..., None]).mul_(p).view(b, nkv, g * n, c1 - c0)
                    dq2 += ds @ kb
                    dk0[:, :, c0:c1] += ds.transpose(-1, -2) @ q2
                    dv0[:, :, c0:c1] += p.view(b, nkv, g * n, c1 - c0).transpose(-1, -2) @ do2
                dq5[:, :, :, r0:r1] = (dqb * scale).to(dq.dtype)
        return (dq, dk0.to(k0.dtype), dv0.to(v0.dtype), None, None, None, None, *ddk, *ddv)
