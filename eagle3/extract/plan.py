"""Deterministic work plan of one extraction task: which samples, in which shards, in which batches.

Resume depends on this being a pure function of (samples still to do, settings):
samples are sorted by (length, id), shards are cut greedily from the front, and
shards are written in order, so the shards already written are always a prefix
of the plan. Re-planning the remainder after a crash gives exactly the shards
the uninterrupted run would have written next. Batches never cross a shard.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from eagle3.errors import InputError


@dataclass(frozen=True)
class Sample:
    """What planning needs of a sample; the tokens stay in the merged table (``row``)."""

    id: str
    num_tokens: int
    row: int = -1


def parse_shard(spec: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        raise InputError(f"--shard {spec!r}: expected I/N, e.g. 0/4 for the first of 4 tasks") from None
    if not (n >= 1 and 0 <= i < n):
        raise InputError(f"--shard {spec!r}: need 0 <= I < N (tasks are numbered from 0)")
    return i, n


def task_name(index: int, count: int) -> str:
    """File-name tag of task I of N (index-<task>.json, shard-<task>-<seq>.safetensors)."""
    return f"{index}of{count}"


def in_task(sample_id: str, index: int, count: int) -> bool:
    """Deterministic 1/N split by a hash of the sample id (stable across runs and machines)."""
    if count == 1:
        return True
    return int(hashlib.sha256(sample_id.encode()).hexdigest()[:16], 16) % count == index


def order(samples: list[Sample]) -> list[Sample]:
    """Length bucketing: neighbours have similar lengths, so batches pad little."""
    return sorted(samples, key=lambda s: (s.num_tokens, s.id))


def cut_shards(samples: list[Sample], shard_tokens: int) -> list[list[Sample]]:
    """Greedy cut of ordered samples into shards of at most shard_tokens real tokens
    (a longer sample gets a shard of its own)."""
    shards, cur, used = [], [], 0
    for s in samples:
        if cur and used + s.num_tokens > shard_tokens:
            shards.append(cur)
            cur, used = [], 0
        cur.append(s)
        used += s.num_tokens
    if cur:
        shards.append(cur)
    return shards


def cut_batches(samples: list[Sample], token_budget: int) -> list[list[Sample]]:
    """Split ordered samples into contiguous batches whose padded size (count x longest)
    stays within token_budget (a sample longer than the budget is a batch of its own).

    Greedy filling pads a lot when lengths are sparse (a 200-token sample next to a
    300-token one). Instead this picks the split that minimizes padded tokens plus a
    per-batch cost of token_budget/128 tokens (the fixed cost of one forward pass), by
    dynamic programming over the sorted lengths: O(n x budget/shortest).
    """
    import numpy as np

    if not samples:
        return []
    lengths = np.array([s.num_tokens for s in samples], dtype=np.int64)
    per_batch = max(1, token_budget // 128)
    best = np.zeros(len(samples) + 1)
    start = np.zeros(len(samples) + 1, dtype=np.int64)
    for j in range(1, len(samples) + 1):
        width = lengths[j - 1]  # the longest of any batch ending at j (sorted ascending)
        lo = max(0, j - max(1, token_budget // width))
        cost = best[lo:j] + (j - np.arange(lo, j)) * width + per_batch
        k = int(np.argmin(cost))  # first minimum: deterministic
        best[j], start[j] = cost[k], lo + k
    batches, j = [], len(samples)
    while j > 0:
        batches.append(samples[start[j]:j])
        j = int(start[j])
    return batches[::-1]


def padding_share(batches: list[list[Sample]]) -> tuple[int, int]:
    """(real tokens, padded tokens) of a list of batches."""
    real = sum(s.num_tokens for b in batches for s in b)
    padded = sum(len(b) * max(s.num_tokens for s in b) for b in batches)
    return real, padded
