"""Sequence parallelism (eagle3/draft/sequence.py): one packed row split over 2 gloo processes gives the
single-process loss, counts and gradients, and each rank's attention rows equal the whole row's."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from eagle3.draft import attention
from eagle3.draft.attention import sample_starts, ttt_attention
from eagle3.draft.sequence import SeqShard
from eagle3.draft.ttt import positions_in_sample, ttt_forward
from eagle3.serving.process import free_port
from tests.draft.tiny import make_tiny_draft, tiny_batch

T = 29  # odd: rank 1 holds 14 rows, rank 0 15
# Samples cross the split at row 15, so rank 1's queries attend rank 0's keys; the last one ends in padding.
SEGMENTS = torch.tensor([[1] * 9 + [2] * 12 + [3] * 8, [1] * 17 + [2] * 7 + [0] * 5])
CASES = [dict(ttt_length=n, checkpoint_steps=c, inputs=i)
         for n, c, i in [(1, False, "row"), (3, False, "window"), (7, False, "row"), (7, True, "window")]]


def test_shard_bounds_cover_the_row_once():
    for width, world in [(29, 2), (10, 3), (2, 4), (4096, 8)]:
        shards = [SeqShard(r, world, width) for r in range(world)]
        rows = [i for s in shards for i in range(s.start, s.stop)]
        assert rows == list(range(width))
        assert all(s.window(7)[1] == min(width, s.stop + 8) for s in shards)
    with pytest.raises(ValueError, match="rank 2 outside a group of 2"):
        SeqShard(2, 2, 10)


@pytest.mark.parametrize("steps", [1, 4])
def test_attention_rows_with_an_offset_equal_the_whole_rows(steps):
    """A rank's query rows against all keys (q_offset) give exactly those rows of the full attention, and
    the same gradients for its queries and diagonal keys."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, T, 8, generator=g, requires_grad=True)
    kv = [torch.randn(2, 2, T, 8, generator=g, requires_grad=True) for _ in range(2 * steps)]
    ks, vs = kv[:steps], kv[steps:]
    d_out = torch.randn(2, 6, T, 8, generator=g)
    starts = sample_starts(positions_in_sample(SEGMENTS))
    full = ttt_attention(q, ks[0], vs[0], starts, ks[1:], vs[1:], block=4)
    want = torch.autograd.grad((full * d_out).sum(), [q, *ks[1:]])
    for a, b in [(0, 15), (15, 29), (7, 20)]:
        part = ttt_attention(q[:, :, a:b], ks[0], vs[0], starts[:, a:b], [k[:, :, a:b] for k in ks[1:]],
                             [v[:, :, a:b] for v in vs[1:]], block=4, q_offset=a)
        torch.testing.assert_close(part, full[:, :, a:b], rtol=1e-6, atol=1e-6)
        got = torch.autograd.grad((part * d_out[:, :, a:b]).sum(), [q, *ks[1:]])
        for gg, ww in zip(got, want):
            torch.testing.assert_close(gg[:, :, a:b], ww[:, :, a:b], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="query rows 20..34 outside the 29 keys"):
        ttt_attention(q[:, :, :14], ks[0], vs[0], starts[:, :14], q_offset=20)


def _run(model, batch, case, shard=None):
    """(loss, counts, correct, {param: grad}) of one TTT forward+backward, global denominators."""
    n = case["ttt_length"]
    norm = torch.full((n,), 40.0, dtype=torch.float64)  # the global counts: one number for every rank
    inputs = dict(batch)
    if shard is not None and case["inputs"] == "window":
        lo, hi = shard.window(n)
        inputs = {k: v[:, lo:hi] for k, v in batch.items()}
    model.zero_grad(set_to_none=True)
    res = ttt_forward(model, **inputs, segment_ids=SEGMENTS, ttt_length=n, normalizer=norm,
                      checkpoint_steps=case["checkpoint_steps"], shard=shard)
    res.loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    return res.loss.detach(), res.counts, res.correct, grads


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        attention.DEFAULT_BLOCK = 4  # several key blocks per rank, some on the other rank
        model = make_tiny_draft()
        batch = tiny_batch(model.config, b=2, t=T)
        results = []
        for case in CASES:
            loss, counts, correct, grads = _run(model, batch, case, SeqShard(rank, 2, T))
            flat = torch.cat([loss.reshape(1), counts.double(), correct.double(),
                              *[g.reshape(-1).double() for g in grads.values()]])
            mine = flat.clone()
            dist.all_reduce(flat)  # what the trainer sums: loss, counts, gradients
            results.append((flat, mine))
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_one_process(monkeypatch, tmp_path):
    out = tmp_path / "ranks.pt"
    mp.start_processes(_rank, args=(free_port(), str(out)), nprocs=2, start_method="spawn", join=True)
    results = torch.load(out)
    monkeypatch.setattr(attention, "DEFAULT_BLOCK", 4)
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=2, t=T)
    for case, (both, rank0) in zip(CASES, results):
        loss, counts, correct, grads = _run(model, batch, case)
        s = case["ttt_length"]
        torch.testing.assert_close(both[0], loss.double(), rtol=1e-5, atol=1e-6)
        assert both[1:1 + s].tolist() == counts.double().tolist(), case
        assert both[1 + s:1 + 2 * s].tolist() == correct.double().tolist(), case
        # rank 0 alone holds only part of it: the split is real
        assert 0 < rank0[1] < counts[0]
        offset = 1 + 2 * s
        for name, g in grads.items():
            got = both[offset:offset + g.numel()].view_as(g)
            torch.testing.assert_close(got, g.double(), rtol=1e-4, atol=1e-6, msg=lambda m: f"{case} {name}: {m}")
            offset += g.numel()
        assert offset == both.numel()
