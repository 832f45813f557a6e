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
    id: str
    input_ids: list[int]
    loss_mask: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


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
    """Greedy batches of ordered samples whose padded size (count x longest) stays within
    token_budget (a sample longer than the budget is a batch of its own)."""
    batches, cur, width = [], [], 0
    for s in samples:
        w = max(width, s.num_tokens)
        if cur and (len(cur) + 1) * w > token_budget:
            batches.append(cur)
            cur, w = [], s.num_tokens
        cur.append(s)
        width = w
    if cur:
        batches.append(cur)
    return batches


def padding_share(batches: list[list[Sample]]) -> tuple[int, int]:
    """(real tokens, padded tokens) of a list of batches."""
    real = sum(s.num_tokens for b in batches for s in b)
    padded = sum(len(b) * max(s.num_tokens for s in b) for b in batches)
    return real, padded
