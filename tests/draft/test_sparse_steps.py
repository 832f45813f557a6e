"""Sparse TTT steps (eagle3/draft/ttt.py): steps 1.. on the positions a loss needs give the dense reference's
loss and gradients; the attention at gathered query positions equals the dense attention's rows there."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft import attention, ttt
from eagle3.draft.attention import sample_starts, ttt_attention
from eagle3.draft.ttt import positions_in_sample, ttt_forward
from tests.draft.test_blockwise_attention import SEGMENTS, T, _dense, _inputs
from tests.draft.tiny import make_tiny_draft, tiny_batch


def _chat_mask() -> torch.Tensor:
    """Loss on answers only: row 0's three samples answer at their ends, row 1's first sample twice (two turns)
    and its second not at all; padding never."""
    lm = torch.zeros(2, T, dtype=torch.uint8)
    lm[0, 3:5], lm[0, 10:14], lm[0, 19:22] = 1, 1, 1
    lm[1, 4:6], lm[1, 8:11] = 1, 1
    return lm


@pytest.mark.parametrize("block", [4, 64])
def test_attention_at_gathered_positions_equals_the_dense_rows(block):
    q, ks, vs, d_out = _inputs(6, 2, 3)
    starts = sample_starts(positions_in_sample(SEGMENTS))
    idx = torch.tensor([[2, 3, 9, 9, 17], [0, 5, 6, 12, 12]])  # non-decreasing, padded with repeats
    bi = torch.arange(2)[:, None]
    dense = _dense(q, ks, vs, SEGMENTS)
    # The gathered queries' diagonal keys are the gathered rows of the full ones.
    got = ttt_attention(q[bi, :, idx].transpose(1, 2), ks[0], vs[0], starts[bi, idx],
                        [k[bi, :, idx].transpose(1, 2) for k in ks[1:]], [v[bi, :, idx].transpose(1, 2) for v in vs[1:]],
                        block=block, q_pos=idx)
    torch.testing.assert_close(got, dense[bi, :, idx].transpose(1, 2), rtol=1e-5, atol=1e-5)
    want_g = torch.autograd.grad((dense[bi, :, idx].transpose(1, 2) * d_out[:, :, :5]).sum(), [q, *ks, *vs])
    got_g = torch.autograd.grad((got * d_out[:, :, :5]).sum(), [q, *ks, *vs])
    for g, w in zip(got_g, want_g):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_gathered_positions_refuse_the_flash_kernel():
    q, ks, vs, _ = _inputs(6, 2, 1)
    starts = sample_starts(positions_in_sample(SEGMENTS))
    with pytest.raises(ValueError, match="q_pos must be"):
        ttt_attention(q, ks[0], vs[0], starts, kernel="flash", q_pos=torch.zeros(2, T, dtype=torch.long))


def _run(model, batch, ttt_length, **kw):
    model.zero_grad(set_to_none=True)
    res = ttt_forward(model, **batch, segment_ids=SEGMENTS, ttt_length=ttt_length, **kw)
    res.loss.backward()
    return res, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("ttt_length", [2, 3, 5])
@pytest.mark.parametrize("checkpoint_steps", [False, True])
@pytest.mark.parametrize("window", [0, 4])  # the whole sample, or a sliding window (`--draft-window`)
def test_sparse_steps_equal_the_dense_reference(ttt_length, checkpoint_steps, window, monkeypatch):
    monkeypatch.setattr(attention, "DEFAULT_BLOCK", 6)
    model = make_tiny_draft(sliding_window=window)
    batch = tiny_batch(model.config, b=2, t=T)
    batch["loss_mask"] = _chat_mask()
    batch["target_argmax_in_draft"][0, 12] = False  # one label outside the draft vocab
    picked = []
    real_rows = ttt._sparse_rows
    monkeypatch.setattr(ttt, "_sparse_rows", lambda *a: picked.append(real_rows(*a)) or picked[-1])
    dense, g_dense = _run(model, batch, ttt_length, attention="dense")
    sparse, g_sparse = _run(model, batch, ttt_length, sparse=True, checkpoint_steps=checkpoint_steps)
    assert picked and picked[-1] is not None and picked[-1][0].shape[1] < T  # it did run gathered
    assert sparse.counts.tolist() == dense.counts.tolist() and sparse.correct.tolist() == dense.correct.tolist()
    assert int(dense.counts[1:].sum()) > 0
    torch.testing.assert_close(sparse.loss, dense.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sparse.loss_sums, dense.loss_sums, rtol=1e-5, atol=1e-6)
    for name, g in g_dense.items():
        torch.testing.assert_close(g_sparse[name], g, rtol=1e-4, atol=1e-6)


def test_auto_runs_sparse_only_below_the_share(monkeypatch):
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=2, t=T)
    calls = []
    real_rows = ttt._sparse_rows
    monkeypatch.setattr(ttt, "_sparse_rows", lambda *a: calls.append(real_rows(*a)) or calls[-1])
    with torch.no_grad():
        ttt_forward(model, **batch, ttt_length=3)  # one sample a row, loss everywhere: not worth it
        batch["loss_mask"] = _chat_mask()
        ttt_forward(model, **batch, segment_ids=SEGMENTS, ttt_length=3)
        ttt_forward(model, **batch, segment_ids=SEGMENTS, ttt_length=3, sparse=False)
        ttt_forward(model, **batch, segment_ids=SEGMENTS, ttt_length=3, attention="dense")
    assert [c is None for c in calls] == [True, False]  # sparse=False and dense never ask


def test_a_micro_batch_without_any_later_loss_still_runs(monkeypatch):
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=2, t=T)
    batch["loss_mask"] = torch.zeros(2, T, dtype=torch.uint8)
    batch["loss_mask"][0, 2] = 1  # step 0 only (t = 0); no step >= 1 has a loss anywhere
    res, grads = _run(model, batch, 3, sparse=True)
    assert res.counts.tolist() == [1, 0, 0] and float(res.loss.detach()) > 0 and grads
