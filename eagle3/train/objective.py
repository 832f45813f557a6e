"""The quantity the optimizer sees: TTT loss normalized over the GLOBAL batch.

`eagle3.draft.ttt.ttt_forward` averages each TTT step over the positions of the
micro-batch it is given. Summed over micro-batches or ranks, such means weight
samples by which micro-batch they landed in, so halving the micro-batch after
an OOM, or splitting a batch over 2 ranks, would change the gradient. Here each
step's summed loss is divided by a denominator N_i counted over the whole
global batch from the data alone (loss positions t+2+i inside the sample), so

    loss = sum_i 0.8^i * S_i(micro) / N_i(global)

and the gradients of all micro-batches on all ranks add up to the same value
whatever the split. Positions whose target argmax is outside the draft vocab
count in N_i with zero loss (they are masked, as the draft's loss masks them).
"""

from __future__ import annotations

import torch

from eagle3.draft import ttt


def step_denominators(loss_masks: list, ttt_length: int) -> torch.Tensor:
    """N_i = sum over samples of loss_mask[2+i:] (fp64 [ttt_length]).

    ``loss_masks``: one 1-D tensor per sample of the global batch, unshifted,
    as the store holds it (CONTRACTS.md alignment: step i at t is masked by
    loss_mask[t+2+i]).
    """
    out = torch.zeros(ttt_length, dtype=torch.float64)
    for m in loss_masks:
        m = m.to(torch.float64)
        for i in range(ttt_length):
            out[i] += m[2 + i:].sum()
    return out


def targets(batch: dict, lm_head: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor,
            known_in_draft: torch.Tensor | None = None):
    """(target_logits_draft [B,T,Vd], target_argmax_in_draft [B,T]) for a collated micro-batch.

    ``last`` (bf16/fp8 stores) goes through the target's lm_head; ``topk_ids``
    + ``topk_logprobs`` (fp8-topk store) become logits that are the top-K
    log-probs at their draft ids and very negative elsewhere. ``known_in_draft``
    [B,T]: the in-draft mask of these samples from an earlier epoch (`InDraftCache`),
    which spares the full-vocab head. Only the positions a loss reads are computed (`ttt.label_rows`).
    """
    if "last" in batch:
        return ttt.target_from_last(batch["last"], lm_head, d2t, t2d, known_in_draft=known_in_draft,
                                    rows=ttt.label_rows(batch["loss_mask"]) if "loss_mask" in batch else None)
    ids, logp = batch["topk_ids"].long(), batch["topk_logprobs"].float()
    draft_index = torch.full((t2d.shape[0],), -1, dtype=torch.long, device=ids.device)
    draft_index[torch.arange(d2t.shape[0], device=ids.device) + d2t] = torch.arange(d2t.shape[0], device=ids.device)
    where = draft_index[ids]  # [B,T,K], -1 when outside the draft vocab
    logits = torch.full((*ids.shape[:-1], d2t.shape[0] + 1), -1e9, device=ids.device)
    logits.scatter_(-1, torch.where(where >= 0, where, d2t.shape[0]), logp)
    return logits[..., :-1], where[..., 0] >= 0


class InDraftCache:
    """Per sample, whether the target's full-vocab argmax lies in the draft vocab, at each position.

    The soft labels' draft-vocab logits cost a [Vd, H] product per token, the in-draft mask a [V, H] one (V/Vd
    times more: 24x for the demo's Vd 2048, and in fp32 whatever the compute precision). The mask of a sample
    never changes (the store's states and the vocab map are fixed), so it is computed at the sample's first
    micro-batch and read afterwards. The logits are the same bits with or without it, so a resumed run (empty
    cache) trains exactly as an uninterrupted one."""

    def __init__(self) -> None:
        self.masks: dict[str, torch.Tensor] = {}

    def get(self, ids: list[str], width: int) -> torch.Tensor | None:
        """[B, width] bool for a micro-batch whose samples are all known, else None (padding: False)."""
        if not all(s in self.masks for s in ids):
            return None
        out = torch.zeros(len(ids), width, dtype=torch.bool)
        for b, s in enumerate(ids):
            out[b, : self.masks[s].shape[0]] = self.masks[s]
        return out

    def put(self, ids: list[str], in_draft: torch.Tensor, attention_mask: torch.Tensor) -> None:
        for b, s in enumerate(ids):
            self.masks[s] = in_draft[b, : int(attention_mask[b].sum())].detach().cpu().clone()


_COMPILED: dict[str, object] = {}


def ttt_function(compiled: bool):
    """`ttt.ttt_forward`, or one torch.compile of it per process (dynamic shapes: micro-batches differ in rows and
    length). Inductor fuses the TTT loop's elementwise work (norms, rope, masks, softmax, the soft cross-entropy)
    into C++ kernels: bench/peer_bench.py --compile measures the gain next to the eager step."""
    if not compiled:
        return ttt.ttt_forward
    if "ttt" not in _COMPILED:
        _COMPILED["ttt"] = torch.compile(ttt.ttt_forward, dynamic=True)
    return _COMPILED["ttt"]


def shard_window(batch: dict, shard, ttt_length: int) -> dict:
    """A collated micro-batch cut to the positions a sequence-parallel process reads (`SeqShard.window`);
    ``attention_mask`` (the segment ids) stays whole: the positions inside each sample need it."""
    lo, hi = shard.window(ttt_length)
    return {k: v if k == "attention_mask" or not torch.is_tensor(v) or v.dim() < 2 else v[:, lo:hi]
            for k, v in batch.items()}


def ttt_sums(draft, batch: dict, target_logits: torch.Tensor, in_draft: torch.Tensor,
             denominators: torch.Tensor, ttt_length: int, compiled: bool = False,
             checkpoint_steps: bool = False, shard=None, sparse: bool = True) -> ttt.TTTResult:
    """TTT over one collated micro-batch with the loss divided by the global ``denominators``; with ``shard``,
    this process's positions of it (eagle3/draft/sequence.py)."""
    return ttt_function(compiled)(draft, batch["input_ids"], batch["aux"], target_logits, in_draft,
                                  batch["loss_mask"], batch["attention_mask"].long(), ttt_length=ttt_length,
                                  normalizer=denominators, checkpoint_steps=checkpoint_steps, shard=shard,
                                  sparse=None if sparse else False)
