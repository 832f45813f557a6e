"""Deterministic planning: task split, length bucketing, batches, resumable shard cuts."""

from __future__ import annotations

import random

import pytest

from eagle3.errors import InputError
from eagle3.extract.plan import (Sample, batch_carry, cut_batches, cut_shards, in_task, order, padding_share,
                                 parse_shard, plan_task, recorded_batches, task_name)
from eagle3.storage_options import bytes_per_token


def _samples(n, seed=0, lo=20, hi=2000):
    rng = random.Random(seed)
    # a long-tailed, chat-like length distribution
    return [Sample(f"id{i:05d}", min(hi, max(lo, int(rng.lognormvariate(5.5, 0.8)))))
            for i in range(n)]


def test_parse_shard():
    assert parse_shard("2/4") == (2, 4) and task_name(2, 4) == "2of4"
    for bad in ("4/4", "x", "1/0", "-1/2"):
        with pytest.raises(InputError, match="--shard"):
            parse_shard(bad)


def test_tasks_split_samples_disjointly_and_completely():
    ids = [s.id for s in _samples(500)]
    parts = [[i for i in ids if in_task(i, k, 3)] for k in range(3)]
    assert sorted(sum(parts, [])) == sorted(ids)
    assert all(100 < len(p) < 240 for p in parts)  # roughly a third each
    assert parts[0] == [i for i in ids if in_task(i, 0, 3)]  # deterministic


def test_batches_respect_budget_and_pad_little():
    batches = cut_batches(order(_samples(2000)), 8192)
    assert all(len(b) * max(s.num_tokens for s in b) <= 8192 for b in batches)
    real, padded = padding_share(batches)
    assert real == sum(s.num_tokens for s in _samples(2000))
    assert 1 - real / padded < 0.05  # goal: < 5% padding FLOPs


def test_sparse_lengths_still_pad_under_5_percent():
    # 64 samples spread over 16..1000 tokens: greedy filling to the budget padded 22% here
    batches = cut_batches(order(_samples(64, seed=3)), 8192)
    real, padded = padding_share(batches)
    assert 1 - real / padded < 0.05
    assert all(len(b) * max(s.num_tokens for s in b) <= 8192 for b in batches)
    assert [s for b in batches for s in b] == order(_samples(64, seed=3))  # contiguous, nothing lost


def test_long_sample_gets_its_own_batch():
    samples = order([Sample("a", 10), Sample("b", 50)])
    assert [[s.id for s in b] for b in cut_batches(samples, 30)] == [["a"], ["b"]]


def test_replanning_the_rest_gives_the_same_shards():
    plan = cut_shards(order(_samples(300)), 5000)
    assert len(plan) > 5
    for k in range(len(plan)):
        rest = [s for shard in plan[k:] for s in shard]
        assert cut_shards(order(rest), 5000) == plan[k:]


def _padded(batch):
    return len(batch) * max(s.num_tokens for s in batch)


def test_batches_are_not_capped_by_the_shard():
    """A 256-MiB shard holds 9,358 fp8 tokens of a 7168-wide target: batches cut inside shards gave a 65,536-token
    budget 4 samples of 2,000 (8,000 tokens) and a server as many requests at a time."""
    samples = order([Sample(f"s{i:03d}", 2000) for i in range(200)])
    shard_tokens = 256 * 2**20 // bytes_per_token("fp8", 7168)
    assert shard_tokens == 9358
    plan = plan_task(samples, 65536, shard_tokens)
    assert max(_padded(b) for b in plan.batches) >= 32768
    assert all(_padded(b) <= 65536 for b in plan.batches)
    assert [sh.samples for sh in plan.shards] == cut_shards(samples, shard_tokens)  # shards as before
    assert [s for b in plan.batches for s in b] == samples


def test_cut_batches_is_suffix_stable():
    """Cutting the rest from any batch start gives the same batches: what a resumed run relies on."""
    for seed, budget in ((0, 4096), (1, 8192), (2, 65536), (3, 300)):
        samples = order(_samples(400, seed=seed))
        batches = cut_batches(samples, budget)
        start = 0
        for k, b in enumerate(batches):
            assert cut_batches(samples[start:], budget) == batches[k:], (seed, budget, k)
            start += len(b)


def _stored_entry(shard) -> dict:
    """What the index records of a planned shard."""
    return {"samples": len(shard.samples), "batch_sizes": list(shard.batch_sizes), "batch_offset": shard.batch_offset}


def test_each_shard_records_the_batches_that_rebuild_it_and_resume_continues_them():
    samples = order(_samples(300, seed=4, hi=600))
    plan = plan_task(samples, 4096, 2500)
    assert any(sh.batch_offset for sh in plan.shards)  # batches do cross shards here
    stored, start = [s for sh in plan.shards for s in sh.samples], 0
    for k, shard in enumerate(plan.shards):
        # a repair: the shard's recorded batches, neighbours included, are the plan's batches holding it
        rebuilt = recorded_batches(stored, start, _stored_entry(shard))
        assert rebuilt and all(b in plan.batches for b in rebuilt)
        assert [s for s in sum(rebuilt, []) if s in shard.samples] == shard.samples
        start += len(shard.samples)
        # a resume after shard k: the carried samples open the batch it was in, and the rest is the same plan
        n = batch_carry(_stored_entry(shard))
        carried = stored[start - n:start] if n else []
        rest = plan_task(samples[start:], 4096, 2500, carried)
        assert rest.shards == plan.shards[k + 1:]
        assert rest.batches == plan.batches[len(plan.batches) - len(rest.batches):]
    # an entry written before batches crossed shards records none: nothing carried, nothing rebuilt
    assert batch_carry({"samples": 3}) == 0 and recorded_batches(stored, 0, {"samples": 3}) is None
    stored[1] = None  # a neighbour no longer in the dataset
    assert recorded_batches(stored, 0, _stored_entry(plan.shards[0])) is None
