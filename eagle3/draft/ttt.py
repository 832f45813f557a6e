"""Training-time test (TTT): the draft's forward over whole sequences, its loss and metrics.

Alignment (docs/CONTRACTS.md "Alignment"; x = input_ids, p_j = the target's
distribution at j, which predicts x_{j+1}). For TTT step i at row position t:

    input token   x_{t+1+i}
    input hidden  fc(aux_t) for i = 0, else the draft's step i-1 output at t
    position id   pos_t + i   (pos_t = t's index inside its sample; step i's
                               query sits where decoding would put it)
    target        p_{t+1+i} restricted to the draft vocab
    mask          loss_mask[t+2+i] and argmax(p_{t+1+i}) in the draft vocab and
                  t+2+i in the same sample as t

P-EAGLE (``draft.config.parallel_drafting``): step i >= 1 is parallel slot i of a round, fed the mask token
and fc(mask_hidden) (`Eagle3Draft.mask_inputs`) instead of x_{t+1+i} and the step i-1 output; position,
target, mask and attention are as above. That is vLLM's parallel drafter: slot i sits at pos_t + i and sees the
real positions <= t plus slots 1..i of its own round.

All shifts happen here, once: callers pass unshifted per-position tensors
exactly as the hidden-state store holds them.

Attention: step i's query at t sees step-0 keys at s <= t of its own sample,
plus the keys of steps 1..i at t only (the diagonal). That is what decoding
sees: a cache of prefix positions plus the chain of the draft's own tokens.
It runs blockwise by default (eagle3/draft/attention.py: no T x T tensor);
``attention="dense"`` keeps the [B,1,T,T]-mask reference for tests.

Sparse steps: step i >= 1 at t matters only if some step j >= i has a loss at t (a chain never leaves its
position). Where those positions are at most `SPARSE_SHARE` of a row (prompts, system turns, tool output,
long documents carry no loss), steps 1.. run on them alone, gathered per row: step 0 still runs everywhere
(every later query attends its keys). The loss and gradients are those of the full computation up to float
rounding (tests/draft/test_sparse_steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from eagle3.acceptance import simulated_acceptance_length as sim_accept_len  # one definition

from eagle3.draft.argmax import in_draft_mask
from eagle3.draft.attention import sample_starts, window_starts
from eagle3.draft.config import DEFAULT_STEP_DECAY, DEFAULT_TTT_LENGTH
from eagle3.draft.loss import head_soft_ce
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.sequence import SeqShard, single

ATTENTIONS = ("blockwise", "dense")  # eagle3/draft/attention.py (O(T) memory), or the T x T reference
SPARSE_SHARE = 0.75
"""Steps 1.. run gathered (module docstring) when the positions they need are at most this share of a row: near a
whole row the gathers and the blockwise kernel (in place of the CPU flash one) eat what the skipped rows save. A
chosen margin, not a measured break-even."""


def target_from_last(last: torch.Tensor, lm_head_weight: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor,
                     norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                     chunk: int = 1024, known_in_draft: torch.Tensor | None = None,
                     fast: bool | None = None, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss's target inputs from the store's `last` states.

    last [.., H] is the final-norm hidden (pass ``norm_weight`` only if it is
    not normed yet). Returns (target_logits_draft [.., Vd]: the target's
    logits at the draft vocab's target ids, target_argmax_in_draft [..] bool:
    the full-vocab argmax lies in the draft vocab). Works in row chunks so the
    full [T, V] logits never exist at once.

    The draft-vocab logits are always the Vd-row product (the same bits either
    way). Only the in-draft mask needs the full [V, H] head; ``known_in_draft``
    (the mask of an earlier call on the same states: the trainer keeps it per
    sample after the first epoch) skips that product, V/Vd times the work. Where it runs, it runs in bf16
    certified in fp32 (`argmax.in_draft_mask`) if ``fast`` (default: the caller runs under bf16 autocast,
    i.e. the compute precision is bf16), else in fp32.

    ``rows`` [..] bool (`label_rows`): the positions whose labels a loss reads; the others get zero logits and
    False, and cost nothing (the full-vocab product is the larger part of a first epoch's step in fp32).
    """
    dev = last.device.type
    if fast is None:
        fast = torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.bfloat16
    draft_ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t
    flat = last.reshape(-1, last.shape[-1])
    if rows is not None:  # the rows a loss reads, gathered; scattered back into zeros / False at the end
        picked = rows.reshape(-1).nonzero().squeeze(1)
        known = None if known_in_draft is None else known_in_draft.reshape(-1)[picked]
        logits_p, mask_p = target_from_last(flat[picked], lm_head_weight, d2t, t2d, norm_weight, eps, chunk,
                                            known, fast)
        logits = flat.new_zeros(flat.shape[0], d2t.shape[0], dtype=logits_p.dtype)
        mask = torch.zeros(flat.shape[0], dtype=torch.bool, device=flat.device)
        logits[picked], mask[picked] = logits_p, mask_p
        return logits.reshape(*last.shape[:-1], -1), mask.reshape(last.shape[:-1])
    w = lm_head_weight.float()
    w_d = w[draft_ids]
    logits_d, normed = [], []
    # The soft labels are computed in fp32 even when the caller runs under bf16 autocast
    # (the training step does on CUDA): autocast would run `x @ w.T` in bf16 whatever the
    # inputs' dtype, rounding the target's logits to 8 bits of mantissa and flipping argmaxes.
    with torch.autocast(device_type=flat.device.type, enabled=False):
        for rows in flat.split(chunk):
            x = rows.float()
            if norm_weight is not None:
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
            logits_d.append(x @ w_d.T)
            normed.append(x)
        if known_in_draft is None and normed:
            mask = in_draft_mask(torch.cat(normed), w, t2d, fast, chunk=min(chunk, 256)).reshape(last.shape[:-1])
    shape = last.shape[:-1]
    if known_in_draft is not None:
        mask = known_in_draft.reshape(shape).to(torch.bool)
    elif not normed:
        mask = torch.zeros(shape, dtype=torch.bool)
    return (torch.cat(logits_d).reshape(*shape, -1) if logits_d else last.new_zeros(*shape, d2t.shape[0]), mask)




def label_rows(loss_mask: torch.Tensor) -> torch.Tensor:
    """[B,T] bool: the positions j whose soft label some TTT step reads. Step i at t reads the label at
    j = t+1+i only where loss_mask[t+2+i], i.e. j is read iff loss_mask[j+1] (the alignment above)."""
    out = torch.zeros_like(loss_mask, dtype=torch.bool)
    out[:, :-1] = loss_mask[:, 1:].bool()
    return out


@dataclass
class TTTResult:
    loss: torch.Tensor
    """sum_i decay^i * loss_i; the tensor to backpropagate."""
    loss_sums: torch.Tensor
    """[S] summed soft CE per step over its masked positions (detached)."""
    correct: torch.Tensor
    """[S] masked positions where the draft's argmax equals the target's."""
    counts: torch.Tensor
    """[S] masked (trained) positions per step."""
    eligible: torch.Tensor | None = None
    """[S] positions whose step-i target is an assistant token of the same sample, the target's argmax in the
    draft vocab or not: the decoder meets those too, and never proposes the out-of-vocab ones."""

    def metrics(self) -> dict[str, float]:
        """`loss`, `loss_i`, `acc_i`, `sim_accept_len`, `tokens_i` (and `in_vocab_i`) as floats."""
        return metrics_from_sums(float(self.loss.detach()), self.loss_sums, self.correct, self.counts, self.eligible)


def metrics_from_sums(loss: float, loss_sums: torch.Tensor, correct: torch.Tensor,
                      counts: torch.Tensor, eligible: torch.Tensor | None = None) -> dict[str, float]:
    """Metrics from (possibly all-reduced or accumulated) per-step sums. ``acc_i`` is over the trained positions
    (the target's argmax in the draft vocab); with ``eligible``, `sim_accept_len` counts the out-of-vocab
    positions as misses, as decoding meets them (`in_vocab_i`: the trained share of the eligible ones)."""
    n = counts.clamp(min=1).double()
    acc = (correct.double() / n).tolist()
    hits = acc if eligible is None else (correct.double() / eligible.clamp(min=1).double()).tolist()
    out = {"loss": loss, "sim_accept_len": sim_accept_len(hits)}
    for i, (l_i, a_i, c_i) in enumerate(zip((loss_sums.double() / n).tolist(), acc, counts.tolist())):
        out[f"loss_{i}"], out[f"acc_{i}"], out[f"tokens_{i}"] = l_i, a_i, float(c_i)
    if eligible is not None:
        for i, (c_i, e_i) in enumerate(zip(counts.tolist(), eligible.tolist())):
            out[f"in_vocab_{i}"] = c_i / e_i if e_i else 1.0
    return out


def _shift(x: torch.Tensor, k: int, fill) -> torch.Tensor:
    """x[:, t] <- x[:, t + k] along dim 1, padded with ``fill`` at the end."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


def positions_in_sample(segment_ids: torch.Tensor) -> torch.Tensor:
    """[B,T] index of each position inside its sample (segments are contiguous)."""
    b, t = segment_ids.shape
    idx = torch.arange(t, device=segment_ids.device).expand(b, t)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return idx - torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values


def step0_mask(segment_ids: torch.Tensor, window: int = 0) -> torch.Tensor:
    """[B,1,T,T]: causal and within one sample (padding, id 0, only sees padding); with ``window``, only the
    last ``window`` positions (the dense reference of `attention.window_starts`)."""
    t = segment_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=segment_ids.device).tril()
    if window:
        causal = causal.triu(-(window - 1))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (causal[None] & same)[:, None]


def _sparse_rows(later: list, rows: int, share: float):
    """(idx [B,N], real [B,N], batch index [B,1]): per row, the positions some step of ``later`` (the
    (mask, valid) of steps 1..) has a loss at, in order, padded with the row's last one (q_pos stays
    non-decreasing; padding is masked out); None when N > ``share`` x rows."""
    need = torch.zeros(later[0][0].shape[0], rows, dtype=torch.bool, device=later[0][0].device)
    for mask, valid in later:
        need[:, :valid] |= mask
    n = max(int(need.sum(1).max()), 1)
    if n > share * rows:
        return None
    order = torch.argsort((~need).to(torch.int8), dim=1, stable=True)[:, :n]  # needed positions first, in order
    real = need.gather(1, order)
    last = torch.where(real, order, -1).amax(1, keepdim=True).clamp(min=0)
    return torch.where(real, order, last), real, torch.arange(need.shape[0], device=need.device)[:, None]


def _step(draft: Eagle3Draft, ids, positions, step0: dict, probs, top, mask, valid: int, hidden, *history):
    """One TTT step and its summed soft CE: (step_sum, correct, next hidden, k, v).

    A pure function of its tensors (``history`` is the flat k0, v0, k1, v1, ... of the earlier steps), so
    `torch.utils.checkpoint` may run it again in backward."""
    pairs = list(zip(history[::2], history[1::2]))
    normed, hidden = draft.ttt_step(ids, hidden, positions, pairs, logits=False, **step0)
    # lm_head + soft CE fused (eagle3/draft/loss.py; `soft_ce_reference` is the unfused definition)
    step_sum, correct = head_soft_ce(normed[:, :valid], draft.lm_head.weight, probs, top, mask)
    k, v = pairs[-1]
    return step_sum, correct, hidden, k, v


def ttt_forward(draft: Eagle3Draft, input_ids: torch.Tensor, aux: torch.Tensor,
                target_logits_draft: torch.Tensor, target_argmax_in_draft: torch.Tensor,
                loss_mask: torch.Tensor, segment_ids: torch.Tensor | None = None,
                ttt_length: int = DEFAULT_TTT_LENGTH, step_decay: float = DEFAULT_STEP_DECAY,
                normalizer: torch.Tensor | None = None, attention: str = "blockwise",
                checkpoint_steps: bool = False, shard: SeqShard | None = None,
                sparse: bool | None = None) -> TTTResult:
    """Run ``ttt_length`` TTT steps and return the loss and per-step counts.

    All inputs are unshifted, per target position j, [B,T,...]:
      input_ids [B,T] x_j; aux [B,T,3H]; target_logits_draft [B,T,Vd] and
      target_argmax_in_draft [B,T] (from `target_from_last` or a compact
      top-k stand-in); loss_mask [B,T] (1 = x_j is an assistant token);
      segment_ids [B,T] int: which sample each position belongs to, 0 for
      padding (default: the whole row is one sample). Several samples may be
      packed in a row; they never attend to each other.
    Loss per step = mean over its masked positions of the soft cross-entropy
    -sum_v softmax(target)_v log softmax(draft)_v over the draft vocab.
    ``normalizer`` [ttt_length], if given, replaces each step's divisor (its
    masked count here) with a count over the global batch, so micro-batches
    and ranks add up to the same gradient however the batch is split.
    ``attention``: "blockwise" (eagle3/draft/attention.py) or "dense" (the
    [B,1,T,T] ``step0_mask`` reference); both give the same loss and gradients.
    ``checkpoint_steps``: keep only each step's inputs for backward and run the
    step again there (`torch.utils.checkpoint`): the same loss and gradients,
    one step's activations (its [T, Vd] log-softmax above all) alive at a time.
    ``shard`` (eagle3/draft/sequence.py): this rank's rows of a row split over a
    process group. ``segment_ids`` is then the whole row [B,T] (it must be given);
    every other input is either the whole row or just ``shard.window(ttt_length)``.
    The result holds this rank's rows' share; summed over the ranks (loss, counts,
    gradients) it is the single-process result.
    ``sparse``: run steps 1.. on the positions a loss needs (module docstring): None decides by
    `SPARSE_SHARE` (blockwise, one process, not under torch.compile), False never, True whenever it can.
    """
    if ttt_length < 1:
        raise ValueError(f"ttt_length must be >= 1, got {ttt_length}")
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    if segment_ids is None:
        if shard is not None:
            raise ValueError("a sequence-parallel shard needs the whole row's segment_ids")
        segment_ids = torch.ones_like(input_ids)
    width = segment_ids.shape[1]
    if shard is None:
        shard = single(width)
    elif attention != "blockwise" or shard.width != width:
        raise ValueError(f"a sequence-parallel shard needs blockwise attention and rows of its width "
                         f"{shard.width} (got {attention}, {width})")
    lo, hi = shard.window(ttt_length)
    rows = shard.stop - lo

    def window(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == width:
            return x[:, lo:hi]
        if x.shape[1] != hi - lo:
            raise ValueError(f"an input of {x.shape[1]} positions: the shard needs {width} or {hi - lo}")
        return x

    pos = positions_in_sample(segment_ids)
    win = draft.config.sliding_window
    step0 = ({"mask0": step0_mask(segment_ids, win)} if attention == "dense"
             else {"starts": window_starts(sample_starts(pos), win)[:, lo:shard.stop]})
    if shard.world > 1:
        step0["shard"] = shard
    input_ids, segs, pos = window(input_ids), segment_ids[:, lo:hi], pos[:, lo:hi]
    loss_mask, in_draft = window(loss_mask).bool(), window(target_argmax_in_draft).bool()
    hidden = draft.project_aux(window(aux)[:, :rows])
    # The target side does not change across steps: its softmax and argmax are taken once.
    target_logits_draft = window(target_logits_draft)
    target_probs = target_logits_draft.float().softmax(-1)
    target_top = target_logits_draft.argmax(-1)
    parallel = draft.config.parallel_drafting  # P-EAGLE: steps 1.. are mask slots (module docstring)
    history: list = []  # k0, v0, k1, v1, ...: flat, so a checkpointed step takes them as tensor arguments
    total = hidden.new_zeros(())
    sums, correct, counts = [], [], []
    masks, eligible = [], []
    for i in range(ttt_length):
        same_sample = (_shift(segs, 2 + i, -1) == segs) & (segs != 0)
        wanted = _shift(loss_mask, 2 + i, False) & same_sample
        mask = wanted & _shift(in_draft, 1 + i, False)
        # Positions t >= width-1-i have no target (the mask is 0 there), so the loss
        # is taken on the first `valid` rows against the target at t+1+i: slices, no copies.
        valid = min(rows, max(width - 1 - i - lo, 0))
        masks.append((mask[:, :valid], valid))
        eligible.append(wanted[:, :valid].sum())
    picked = None
    if sparse is not False and ttt_length > 1 and attention == "blockwise" and shard.world == 1 \
            and not torch.compiler.is_compiling():
        picked = _sparse_rows(masks[1:], rows, 1.0 if sparse else SPARSE_SHARE)
    for i in range(ttt_length):
        mask, valid = masks[i]
        if i >= 1 and picked is not None:
            idx, real, bi = picked
            if i == 1:  # from here on every tensor is per gathered row
                hidden = hidden[bi, idx]
                gathered0 = {"starts": step0["starts"][bi, idx], "q_pos": idx}
            label = (idx + 1 + i).clamp(max=target_probs.shape[1] - 1)
            mask = F.pad(mask, (0, rows - valid))[bi, idx] & real
            ids = _shift(input_ids, 1 + i, 0)[bi, idx]
            if parallel:
                ids, hidden = draft.mask_inputs(tuple(ids.shape))
            step = partial(_step, draft, ids, (pos + i)[bi, idx], gathered0,
                           target_probs[bi, label], target_top[bi, label], mask, idx.shape[1])
        else:
            ids = _shift(input_ids, 1 + i, 0)[:, :rows]
            if parallel and i >= 1:
                ids, hidden = draft.mask_inputs(tuple(ids.shape))
            step = partial(_step, draft, ids, pos[:, :rows] + i, step0,
                           target_probs[:, 1 + i:1 + i + valid], target_top[:, 1 + i:1 + i + valid], mask, valid)
        if checkpoint_steps:
            step_sum, step_correct, hidden, k, v = checkpoint(step, hidden, *history, use_reentrant=False)
        else:
            step_sum, step_correct, hidden, k, v = step(hidden, *history)
        history += [k, v]
        n = mask.sum()
        divisor = n.clamp(min=1) if normalizer is None else max(float(normalizer[i]), 1.0)
        total = total + (step_decay ** i) * step_sum / divisor
        sums.append(step_sum.detach())
        correct.append(step_correct)
        counts.append(n)
    return TTTResult(total, torch.stack(sums), torch.stack(correct), torch.stack(counts), torch.stack(eligible))
