"""Deterministic work plan of one extraction task: which samples, in which shards, in which batches.

Resume depends on this being a pure function of (samples still to do, settings):
samples are sorted by (length, id), shards are cut greedily from the front, and
shards are written in order, so the shards already written are always a prefix
of the plan. Re-planning the remainder after a crash gives exactly the shards
the uninterrupted run would have written next.

Batches are cut over the whole list, not per shard: a shard (256 MiB) holds only
~9K tokens of a 7168-wide target, so batches inside shards would cap every forward,
and a server's requests in flight, at that. A batch may therefore cross shards.
Its samples' states do not depend on the shard cut, but they do depend on the
batch (other shapes change the summation order), so each shard's index entry
records the batches that held its samples (:class:`ShardPlan`): a resumed run
forwards the batch that was open at the last written shard again, from its first
sample (:func:`batch_carry`), and the batch cut is suffix-stable
(:func:`cut_batches`), so it continues with exactly the batches the uninterrupted
run had; a repair forwards a shard's samples in its recorded batches
(:func:`recorded_batches`). Either way the same bytes.
"""

from __future__ import annotations

import bisect
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


def sort_key(sample: Sample) -> tuple[int, str]:
    """The plan's order: by length, then id."""
    return sample.num_tokens, sample.id


def order(samples: list[Sample]) -> list[Sample]:
    """Length bucketing: neighbours have similar lengths, so batches pad little."""
    return sorted(samples, key=sort_key)


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

    The programme runs from the end (best[i]: the cheapest split of samples[i:]), so
    the cut is suffix-stable: cutting samples[p:] at a batch start p of the whole cut
    gives the whole cut's batches from p on. A resumed run re-plans from such a p.
    """
    import numpy as np

    if not samples:
        return []
    n = len(samples)
    lengths = np.array([s.num_tokens for s in samples], dtype=np.int64)
    per_batch = max(1, token_budget // 128)
    best = np.zeros(n + 1)
    end = np.zeros(n + 1, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        ends = np.arange(i + 1, min(n, i + max(1, token_budget // lengths[i])) + 1)
        width = lengths[ends - 1]  # the longest of batch [i, e) (sorted ascending)
        fits = (ends - i) * width <= token_budget
        fits[0] = True  # one sample is a batch whatever its length; fits is a prefix: width grows with e
        ends, width = ends[fits], width[fits]
        cost = (ends - i) * width + per_batch + best[ends]
        k = int(np.argmin(cost))  # first minimum: deterministic
        best[i], end[i] = cost[k], ends[k]
    batches, i = [], 0
    while i < n:
        batches.append(samples[i:end[i]])
        i = int(end[i])
    return batches


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write: its samples, and the batches of the plan that hold them (kept in its index entry)."""

    samples: list[Sample]
    batch_sizes: tuple[int, ...]
    """Sizes of the plan's batches that hold its samples, in order (the first and last may reach into the
    shards before and after it)."""
    batch_offset: int = 0
    """Samples of the first of those batches that come before this shard."""
    name: str | None = None
    """A repair rewrites this shard; None: the task's next shard."""


@dataclass(frozen=True)
class Plan:
    """Batches to forward, in order, and the shards their samples fill, in order. The batches may begin with
    samples no shard of the plan holds (stored already; forwarded again only to rebuild a batch)."""

    batches: list[list[Sample]]
    shards: list[ShardPlan]


def plan_task(todo: list[Sample], token_budget: int, shard_tokens: int, carried: list[Sample] = ()) -> Plan:
    """The plan for ``todo`` (ordered): shards cut from it alone (:func:`cut_shards`), batches cut over
    ``carried + todo`` (:func:`cut_batches`), so a batch may cross shards. ``carried``: stored samples that
    open the first batch (a resumed run's :func:`batch_carry`)."""
    run = [*carried, *todo]
    batches = cut_batches(run, token_budget)
    starts = [0]
    for b in batches:
        starts.append(starts[-1] + len(b))
    shards, pos = [], len(carried)
    for samples in cut_shards(todo, shard_tokens):
        first = bisect.bisect_right(starts, pos) - 1
        last = bisect.bisect_right(starts, pos + len(samples) - 1) - 1
        shards.append(ShardPlan(samples, tuple(len(b) for b in batches[first:last + 1]), pos - starts[first]))
        pos += len(samples)
    return Plan(batches, shards)


def batch_carry(entry: dict) -> int:
    """How many stored samples (ending with this shard's last) the batch after this shard starts with, from
    its index entry; 0 when the shard ends a batch, or its entry records no batches (written before
    batches crossed shards)."""
    sizes = entry.get("batch_sizes")
    if not sizes:
        return 0
    after = sum(sizes) - int(entry.get("batch_offset", 0)) - int(entry["samples"])
    return sizes[-1] - after if after > 0 else 0


def recorded_batches(stored: list, start: int, entry: dict) -> list[list[Sample]] | None:
    """The batches a stored shard's samples were forwarded in, rebuilt from its index entry: ``stored`` is
    the task's samples in stored order (None for one no longer in the dataset) and the shard's are
    ``stored[start:start + entry["samples"]]``. None when the entry records no batches or a neighbour the
    batches need is gone."""
    sizes = entry.get("batch_sizes")
    if not sizes:
        return None
    lo = start - int(entry.get("batch_offset", 0))
    hi = lo + sum(sizes)
    if lo < 0 or hi > len(stored) or hi < start + int(entry["samples"]):
        return None
    run = stored[lo:hi]
    if None in run or order(run) != run:
        return None
    out, i = [], 0
    for k in sizes:
        out.append(run[i:i + k])
        i += k
    return out


def padding_share(batches: list[list[Sample]]) -> tuple[int, int]:
    """(real tokens, padded tokens) of a list of batches."""
    real = sum(s.num_tokens for b in batches for s in b)
    padded = sum(len(b) * max(s.num_tokens for s in b) for b in batches)
    return real, padded
