"""The blockwise TTT attention (eagle3/draft/attention.py) equals the dense reference, in O(T) saved memory."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft import attention
from eagle3.draft.attention import sample_starts, ttt_attention
from eagle3.draft.model import DraftAttention
from eagle3.draft.ttt import positions_in_sample, step0_mask, ttt_forward
from tests.draft.tiny import make_tiny_draft, tiny_batch, tiny_config

T = 23
# Two packed rows of unequal samples; the second ends in padding (id 0), as collate pads.
SEGMENTS = torch.tensor([[1] * 5 + [2] * 9 + [3] * 8 + [4], [1] * 11 + [2] * 7 + [0] * 5])


def _dense(q, ks, vs, seg):
    """Today's dense path: DraftAttention.attend without its o_proj, as [B,nh,T,hd]."""
    b, nh, t, hd = q.shape
    mod = DraftAttention(tiny_config(num_attention_heads=nh, num_key_value_heads=ks[0].shape[1], head_dim=hd))
    mod.project_out = lambda out: out
    return mod.attend(q, ks[0], vs[0], step0_mask(seg), ks[1:], vs[1:])


def _inputs(nh, nkv, steps, dtype=torch.float32, hd=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, nh, T, hd, generator=g).to(dtype).requires_grad_()
    ks = [torch.randn(2, nkv, T, hd, generator=g).to(dtype).requires_grad_() for _ in range(steps)]
    vs = [torch.randn(2, nkv, T, hd, generator=g).to(dtype).requires_grad_() for _ in range(steps)]
    return q, ks, vs, torch.randn(2, nh, T, hd, generator=g)


def _out_and_grads(fn, q, ks, vs, d_out):
    out = fn(q, ks, vs)
    return (out, *torch.autograd.grad((out.float() * d_out).sum(), [q, *ks, *vs]))


@pytest.mark.parametrize("steps", range(1, 8))  # TTT step i attends step-0 keys plus i diagonal keys
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])  # GQA group 3 (SmolLM2's 9/3), and plain MHA
def test_matches_dense_forward_and_gradients(steps, heads):
    q, ks, vs, d_out = _inputs(*heads, steps)
    starts = sample_starts(positions_in_sample(SEGMENTS))
    want = _out_and_grads(lambda q, ks, vs: _dense(q, ks, vs, SEGMENTS), q, ks, vs, d_out)
    for block in (5, 7, 64):  # none divides T=23; 64 is one block
        got = _out_and_grads(lambda q, ks, vs: ttt_attention(q, ks[0], vs[0], starts, ks[1:], vs[1:], block=block),
                             q, ks, vs, d_out)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_bf16_inputs_use_fp32_statistics_and_return_bf16():
    q, ks, vs, d_out = _inputs(6, 2, 4, dtype=torch.bfloat16)
    starts = sample_starts(positions_in_sample(SEGMENTS))
    got = _out_and_grads(lambda q, ks, vs: ttt_attention(q, ks[0], vs[0], starts, ks[1:], vs[1:], block=7),
                         q, ks, vs, d_out)
    assert all(g.dtype == torch.bfloat16 for g in got)
    up = [x.detach().float().requires_grad_() for x in (q, *ks, *vs)]  # the same bf16 values, dense in fp32
    want = _out_and_grads(lambda q, ks, vs: _dense(q, ks, vs, SEGMENTS), up[0], up[1:5], up[5:], d_out)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w, rtol=2e-2, atol=2e-2)


def dense_and_blockwise(model, batch, ttt_length: int) -> list:
    """[(result, {param: grad})] of the dense reference, then of the blockwise attention, on the same batch."""
    runs = []
    for kind in ("dense", "blockwise"):
        model.zero_grad(set_to_none=True)
        res = ttt_forward(model, **batch, segment_ids=SEGMENTS, ttt_length=ttt_length, attention=kind)
        res.loss.backward()
        runs.append((res, {n: p.grad for n, p in model.named_parameters()}))
    return runs


@pytest.mark.parametrize("ttt_length", range(1, 8))
def test_whole_draft_loss_and_gradients_equal_dense(ttt_length, monkeypatch):
    monkeypatch.setattr(attention, "DEFAULT_BLOCK", 6)  # several blocks, the last one short
    model = make_tiny_draft()
    (dense, g_dense), (block, g_block) = dense_and_blockwise(model, tiny_batch(model.config, b=2, t=T), ttt_length)
    torch.testing.assert_close(block.loss, dense.loss, rtol=1e-5, atol=1e-6)
    assert block.counts.tolist() == dense.counts.tolist() and block.correct.tolist() == dense.correct.tolist()
    for name, g in g_dense.items():
        torch.testing.assert_close(g_block[name], g, rtol=1e-4, atol=1e-6)


def test_checkpointed_steps_give_the_same_loss_and_gradients():
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=2, t=T)
    runs = []
    for ckpt in (False, True):
        model.zero_grad(set_to_none=True)
        res = ttt_forward(model, **batch, segment_ids=SEGMENTS, ttt_length=4, checkpoint_steps=ckpt)
        res.loss.backward()
        runs.append((res, {n: p.grad for n, p in model.named_parameters()}))
    (plain, g_plain), (ckpt, g_ckpt) = runs
    assert torch.equal(ckpt.loss, plain.loss) and torch.equal(ckpt.correct, plain.correct)
    for name, g in g_plain.items():
        torch.testing.assert_close(g_ckpt[name], g, rtol=1e-6, atol=1e-7)


def test_ttt_step_takes_exactly_one_attention_layout(tiny_draft):
    ids, hidden, pos = torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, 32), torch.arange(4)[None]
    with pytest.raises(ValueError, match="exactly one"):
        tiny_draft.ttt_step(ids, hidden, pos, [])
    with pytest.raises(ValueError, match="attention must be one of"):
        ttt_forward(tiny_draft, **tiny_batch(tiny_draft.config, b=1, t=4), attention="flash")


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn`` runs (each storage once)."""
    seen: dict[int, int] = {}

    def pack(x):
        seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fn()
    return sum(seen.values()), out


def test_saved_memory_grows_linearly_with_length():
    """Forward+backward at T=4096 and 8192 (one sample, TTT step 7): saved bytes double, and stay far below the
    dense path's fp32 scores alone (heads x T x T x 4 bytes, 1 GiB at 8192)."""
    saved = {}
    for t in (4096, 8192):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 2, t, 16, generator=g, requires_grad=True)
        kv = [torch.randn(1, 1, t, 16, generator=g, requires_grad=True) for _ in range(14)]
        starts = torch.zeros(1, t, dtype=torch.long)
        saved[t], out = _saved_bytes(lambda: ttt_attention(q, kv[0], kv[7], starts, kv[1:7], kv[8:]))
        out.sum().backward()
        assert q.grad.shape == q.shape and all(x.grad is not None for x in kv)
        assert saved[t] < 2 * t * t * 4 / 20
    assert 1.9 < saved[8192] / saved[4096] < 2.1


def test_whole_ttt_forward_saves_linear_memory():
    """Nothing else in the TTT loop is quadratic: the tiny draft's saved bytes double from T=1024 to 2048."""
    model = make_tiny_draft()
    saved = {}
    for t in (1024, 2048):
        batch = tiny_batch(model.config, b=1, t=t)
        saved[t], _ = _saved_bytes(lambda: ttt_forward(model, **batch, ttt_length=3).loss)
    assert 1.9 < saved[2048] / saved[1024] < 2.1
    dense, _ = _saved_bytes(lambda: ttt_forward(model, **tiny_batch(model.config, b=1, t=1024), ttt_length=3,
                                                attention="dense").loss)
    assert dense > 4 * saved[1024]  # the reference keeps 3 steps of [T, T] scores and probabilities
