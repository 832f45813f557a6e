"""Sliding-window draft attention (DraftConfig.sliding_window, TrainConfig.draft_window): the blockwise TTT
attention with narrowed sample starts equals a dense softmax under an explicit window mask, forward and
gradients; the whole draft's loss and gradients match the dense path; decoding windows as training did; the
export writes the keys vLLM reads."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft import attention
from eagle3.draft.attention import sample_starts, ttt_attention, window_starts
from eagle3.draft.ttt import positions_in_sample, ttt_forward
from tests.draft.test_blockwise_attention import SEGMENTS, T, dense_and_blockwise  # the same packed rows
from tests.draft.tiny import make_tiny_draft, tiny_batch



def _reference(q, ks, vs, seg, window):
    """A plain dense softmax: key s (step 0) is visible to row t iff same sample, s <= t and t - s < window;
    later steps' keys only at t. Written out independently of the model's masks."""
    b, nh, t, hd = q.shape
    g = nh // ks[0].shape[1]
    k0, v0 = (x.repeat_interleave(g, dim=1) for x in (ks[0], vs[0]))
    s = (q @ k0.transpose(-1, -2)) * hd ** -0.5
    rows, cols = torch.arange(t)[:, None], torch.arange(t)[None, :]
    ok = (seg[:, :, None] == seg[:, None, :]) & (cols <= rows)[None] & ((rows - cols) < window)[None]
    s = s.masked_fill(~ok[:, None], float("-inf"))
    diag = [(q * k.repeat_interleave(g, dim=1)).sum(-1, keepdim=True) * hd ** -0.5 for k in ks[1:]]
    p = torch.cat([s, *diag], -1).softmax(-1)
    out = p[..., :t] @ v0
    for j, v in enumerate(vs[1:]):
        out = out + p[..., t + j, None] * v.repeat_interleave(g, dim=1)
    return out


@pytest.mark.parametrize("window", [1, 3, 6, 50])  # 50 > T: no window at all
@pytest.mark.parametrize("steps", [1, 3])
def test_blockwise_window_matches_a_dense_masked_reference(window, steps):
    g = torch.Generator().manual_seed(window * 10 + steps)
    q = torch.randn(2, 6, T, 8, generator=g).requires_grad_()
    ks = [torch.randn(2, 2, T, 8, generator=g).requires_grad_() for _ in range(steps)]
    vs = [torch.randn(2, 2, T, 8, generator=g).requires_grad_() for _ in range(steps)]
    d_out = torch.randn(2, 6, T, 8, generator=g)
    leaves = [q, *ks, *vs]
    ref = _reference(q, ks, vs, SEGMENTS, window)
    want = (ref, *torch.autograd.grad((ref * d_out).sum(), leaves))
    starts = window_starts(sample_starts(positions_in_sample(SEGMENTS)), window)
    for block in (4, 7, 64):
        out = ttt_attention(q, ks[0], vs[0], starts, ks[1:], vs[1:], block=block)
        got = (out, *torch.autograd.grad((out * d_out).sum(), leaves))
        for a, b in zip(got, want):
            # padding rows (segment 0) see only padding in both; compare everything
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_window_skips_key_blocks_before_every_rows_window():
    starts = window_starts(torch.zeros(1, 64, dtype=torch.long), 8)
    plan = attention._plan(starts, 8, torch.arange(64)[None])
    assert all(len(keys) <= 2 for _, _, keys in plan)  # the row's own block and the one before, not all


@pytest.mark.parametrize("ttt_length", [1, 4])
def test_whole_draft_with_a_window_equals_dense(ttt_length, monkeypatch):
    monkeypatch.setattr(attention, "DEFAULT_BLOCK", 6)
    model = make_tiny_draft(sliding_window=4)
    batch = tiny_batch(model.config, b=2, t=T)
    (dense, g_dense), (block, g_block) = dense_and_blockwise(model, batch, ttt_length)
    dense, block = dense.loss.detach(), block.loss.detach()
    torch.testing.assert_close(block, dense, rtol=1e-5, atol=1e-6)
    for name, g in g_dense.items():
        torch.testing.assert_close(g_block[name], g, rtol=1e-4, atol=1e-6)
    unwindowed = ttt_forward(make_tiny_draft(), **batch, segment_ids=SEGMENTS, ttt_length=ttt_length).loss
    assert not torch.allclose(unwindowed, block)  # the window changed what the draft sees


def test_decoding_windows_as_training_does():
    """Step 0 of TTT over one sample equals the decoder's causal step over the same tokens."""
    model = make_tiny_draft(sliding_window=3).eval()
    batch = tiny_batch(model.config, b=1, t=12)
    ids, aux = batch["input_ids"], batch["aux"]
    pos = torch.arange(12)[None]
    with torch.no_grad():
        starts = window_starts(sample_starts(pos), 3)
        ttt_logits, _ = model.ttt_step(ids, aux, pos, [], starts=starts)
        dec_logits, _ = model.step(ids, aux, pos)
    torch.testing.assert_close(dec_logits, ttt_logits, rtol=1e-5, atol=1e-5)


def test_export_writes_the_keys_vllm_reads():
    from eagle3.export import draft_config_json

    cfg = make_tiny_draft(sliding_window=2048).config
    c = draft_config_json(cfg, "bfloat16")
    assert c["sliding_window"] == 2048 and c["layer_types"] == ["sliding_attention"]
    assert "sliding_window" not in draft_config_json(make_tiny_draft().config, "bfloat16")
    assert type(cfg).from_dict(cfg.to_dict()).sliding_window == 2048  # the checkpoint's config.json
