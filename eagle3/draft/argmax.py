"""Whether the target's full-vocab argmax lies in the draft vocab: the in-draft mask of the soft labels.

The fp32 way is one [rows, H] x [H, V] product and an argmax per row: at SmolLM2's V=49152 a training step's
largest matmul (13% of a bf16 step's counted FLOPs, run at the fp32 rate). On a machine whose compute
precision is bf16 (eagle3.devices.resolve_precision), `in_draft_mask(fast=True)` runs that product in bf16 and
certifies it: per row, every vocab entry whose bf16 logit comes within a proven error bound of the row's bf16
maximum is a candidate, and the candidates alone are recomputed in fp32; the argmax among them is the fp32
argmax. The bound, for z = x . w_v, bf16 inputs and output, fp32 accumulation over K = H terms:

    |z_bf16 - z_exact| <= sum_i |x_i w_vi| (3u + u^2 + 1.05 K 2^-24),  u = 2^-8 (bf16 unit roundoff)
    |z_fp32 - z_exact| <= sum_i |x_i w_vi| 1.01 K 2^-24,   and   sum_i |x_i w_vi| <= |x| max_v |w_v|

so the fp32 argmax v' has z_bf16(v') >= max z_bf16 - 2 (both bounds): it is among the candidates. Only fp32
rounding ties (two entries within the fp32 product's own error) can come out differently from the one fp32
product, as they could between two fp32 GEMM libraries. A chunk with more than `MAX_CANDIDATES` candidates per
row on average (a loose bound: huge-norm rows, nearly flat logits) is computed the fp32 way instead.

The search reads the [rows, V] bf16 logits once: the maxima of blocks of `VOCAB_BLOCK` entries give each row's
maximum and say which blocks hold a candidate; only those blocks are compared entry by entry. (A compare and a
nonzero over the whole chunk cost more than its product on an AMX machine: 88 against 57 ms for 1024 rows at
V = 49152.)
"""

from __future__ import annotations

import torch

from eagle3.draft.loss import derived

BF16_UNIT = 2.0 ** -8
MAX_CANDIDATES = 64
"""Average candidates per row above which a chunk falls back to the fp32 product (their recompute gathers
H floats per candidate)."""
VOCAB_BLOCK = 128
"""Vocab entries per block maximum (module docstring)."""


def bound_factor(k: int) -> float:
    """C with |z_bf16 - z_exact| + |z_fp32 - z_exact| <= C |x| max|w_v| for K = ``k`` terms (module docstring),
    rounded up."""
    u = BF16_UNIT
    return 3 * u + u * u + 2.1 * k * 2.0 ** -24


def in_draft_mask(x: torch.Tensor, w: torch.Tensor, t2d: torch.Tensor, fast: bool, chunk: int = 256) -> torch.Tensor:
    """[N] bool: t2d[argmax_v x_r . w_v] for x [N, H] fp32 and w [V, H] fp32, in row chunks.

    ``fast``: the bf16 product certified in fp32 (module docstring); else the fp32 product. The default chunk
    keeps a chunk's bf16 logits (25 MB at V=49152) under glibc's 32 MiB mmap ceiling: reused, not re-faulted."""
    if not fast:
        return torch.cat([t2d[(rows @ w.T).argmax(-1)] for rows in x.split(chunk)]) if len(x) else t2d[:0]
    wb = derived(w, "in-draft bf16", lambda x: x.to(torch.bfloat16))  # the target head is fixed for a run
    wmax = derived(w, "in-draft max norm", lambda x: x.norm(dim=1).max())
    slack = 2 * bound_factor(w.shape[1]) * wmax
    out = []
    for rows in x.split(chunk):
        zb = rows.to(torch.bfloat16) @ wb.T
        found = _candidates(zb, slack * rows.norm(dim=1), MAX_CANDIDATES * len(rows))
        if found is None:
            out.append(t2d[(rows @ w.T).argmax(-1)])
            continue
        r, v = found
        vals = torch.linalg.vecdot(rows[r], w[v])  # the candidates' fp32 logits
        best = torch.full((len(rows),), float("-inf"), device=x.device).scatter_reduce(0, r, vals, "amax")
        hit = vals == best[r]
        first = torch.full((len(rows),), w.shape[0], dtype=torch.long, device=x.device)
        first = first.scatter_reduce(0, r[hit], v[hit], "amin")  # the first maximal index, as argmax
        if bool((first == w.shape[0]).any()):  # a row without candidates (NaN logits): the fp32 way
            first = (rows @ w.T).argmax(-1)
        out.append(t2d[first])
    return torch.cat(out) if out else t2d[:0]


def _candidates(zb: torch.Tensor, slack: torch.Tensor, most: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(row, vocab) indices of the entries of zb [n, V] (bf16) within ``slack`` [n] of their row's maximum; None
    when there are more than ``most`` (module docstring: block maxima first, then the blocks that hold one)."""
    n, vocab = zb.shape
    full = vocab - vocab % VOCAB_BLOCK
    blocks = zb[:, :full].unflatten(1, (-1, VOCAB_BLOCK))  # a view: [n, full / VOCAB_BLOCK, VOCAB_BLOCK]
    tail = zb[:, full:]
    maxima = blocks.amax(-1)
    top = torch.cat([maxima, tail], 1).amax(-1).float()
    thr = top - slack
    # Compared in bf16 (no fp32 copy of the logits): the threshold moved down by more than bf16's rounding
    # of it (2^-9 relative) and a subnormal's step, so the candidates only grow.
    thr = (thr - thr.abs() * 2.0 ** -7 - 1e-30).to(torch.bfloat16)
    br, bb = (maxima >= thr[:, None]).nonzero(as_tuple=True)
    if len(br) > most:  # every such block holds at least one candidate
        return None
    cr, cc = (blocks[br, bb] >= thr[br, None]).nonzero(as_tuple=True)
    tr, tc = (tail >= thr[:, None]).nonzero(as_tuple=True)
    r, v = torch.cat([br[cr], tr]), torch.cat([bb[cr] * VOCAB_BLOCK + cc, tc + full])
    return None if len(r) > most else (r, v)
