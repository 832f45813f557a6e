"""Training batches from the hidden-state store.

The batch plan depends only on (sample lengths, seed, epoch, effective token
budget), never on the micro-batch size or the number of processes, so:

- an OOM that halves the micro-batch (and doubles accumulation) sees the same
  optimizer steps, and
- N data-parallel ranks together see exactly the samples one process would.

One optimizer step = one *global batch*: samples in shuffled order, added
until their real tokens reach ``global_tokens`` (= micro-batch tokens x
grad_accum x world size). Each rank takes a disjoint, token-balanced slice of
it and cuts that into *micro-batches* of at most ``micro_tokens`` padded tokens
(length-sorted, so padding stays small). Tensors are read memory-mapped from
the shards only when a micro-batch is collated.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass


def heldout_split(ids: list[str], share: float) -> tuple[list[str], list[str]]:
    """(train, heldout): a sample is held out when the hash of its id falls below ``share``.

    Depends on the id alone, so the held-out set stays the same across seeds,
    epochs and re-extractions that add samples.
    """
    def rank(sid: str) -> float:
        return int.from_bytes(hashlib.sha256(f"heldout:{sid}".encode()).digest()[:8], "big") / 2**64

    train, held = [], []
    for sid in ids:
        (held if rank(sid) < share else train).append(sid)
    if share > 0 and not held and len(train) > 1:  # tiny stores: keep one for evaluation, by its id alone too
        first = min(train, key=rank)
        train.remove(first)
        held.append(first)
    return train, held


def global_batches(ids: list[str], lengths: dict[str, int], global_tokens: int, seed: int, epoch: int
                   ) -> list[list[str]]:
    """The optimizer steps of one epoch: shuffled by (seed, epoch), cut by real-token budget."""
    order = sorted(ids)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    batches, cur, cur_tokens = [], [], 0
    for sid in order:
        n = lengths[sid]
        if cur and cur_tokens + n > global_tokens:
            batches.append(cur)
            cur, cur_tokens = [], 0
        cur.append(sid)
        cur_tokens += n
    if cur:
        batches.append(cur)
    return batches


def rank_slice(batch: list[str], lengths: dict[str, int], rank: int, world: int) -> list[str]:
    """This rank's disjoint share of a global batch, balanced by tokens (longest first, to the lightest rank)."""
    if world == 1:
        return list(batch)
    loads = [0] * world
    mine = []
    for sid in sorted(batch, key=lambda s: (-lengths[s], s)):
        r = min(range(world), key=lambda k: (loads[k], k))
        loads[r] += lengths[sid]
        if r == rank:
            mine.append(sid)
    return mine


def micro_batches(ids: list[str], lengths: dict[str, int], micro_tokens: int) -> list[list[str]]:
    """Cut ids into micro-batches of at most ``micro_tokens`` padded tokens (rows x longest row).

    A sample longer than the budget goes alone (the OOM handler refuses to halve below it).
    """
    out, cur = [], []
    for sid in sorted(ids, key=lambda s: (-lengths[s], s)):
        longest = lengths[cur[0]] if cur else lengths[sid]
        if cur and (len(cur) + 1) * longest > micro_tokens:
            out.append(cur)
            cur = []
        cur.append(sid)
    if cur:
        out.append(cur)
    return out


def padded_tokens(ids: list[str], lengths: dict[str, int]) -> int:
    return len(ids) * max(lengths[s] for s in ids) if ids else 0


@dataclass
class Position:
    """Where the data stream stands: the next global batch is batches(epoch)[index]."""

    epoch: int = 0
    index: int = 0

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


def collate(store, ids: list[str], device="cpu") -> dict:
    """Right-padded tensors of a micro-batch.

    Returns every per-token tensor the store gives (``aux`` as fp32 [B,T,3H],
    ``last`` [B,T,H] or ``topk_ids``/``topk_logprobs`` [B,T,K], ``input_ids``
    int64 [B,T], ``loss_mask`` [B,T]) plus ``attention_mask`` bool [B,T] (True
    on real tokens). Padding rows are zeros and never count: the loss masks
    them, and with causal attention no real position attends to a later pad.
    """
    import torch

    # a SampleSource (eagle3.train.source); online, one target forward computes the samples the store lacks
    samples = store.get_many(ids)
    lens = [int(s["input_ids"].shape[0]) for s in samples]
    B, T = len(samples), max(lens)
    out = {}
    for key in samples[0]:
        first = samples[0][key]
        dtype = {"input_ids": torch.long, "topk_ids": torch.long, "loss_mask": torch.long}.get(key, torch.float32)
        buf = torch.zeros((B, T, *first.shape[1:]), dtype=dtype)
        for b, s in enumerate(samples):
            buf[b, : lens[b]] = s[key].to(dtype)
        out[key] = buf.to(device, non_blocking=True)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(lens):
        mask[b, :n] = True
    out["attention_mask"] = mask.to(device)
    return out
