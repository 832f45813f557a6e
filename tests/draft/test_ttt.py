"""TTT alignment, masking, packing and loss; each known trainer bug has a test that fails under it."""

from __future__ import annotations

import torch

from eagle3.draft.ttt import label_rows, sim_accept_len, target_from_last, ttt_forward
from tests.draft.tiny import make_tiny_draft, tiny_batch

M = 7  # the one position whose loss_mask is 1 in the alignment tests


def _one_mask_batch(model, t=12):
    batch = tiny_batch(model.config, b=1, t=t)
    batch["loss_mask"] = torch.zeros(1, t, dtype=torch.uint8)
    batch["loss_mask"][0, M] = 1
    return batch


def _loss0(model, batch):
    with torch.no_grad():
        r = ttt_forward(model, **batch, ttt_length=1)
    return r.loss_sums[0].item(), r.counts[0].item()


def test_shift_is_applied_exactly_once():
    """loss_mask[M] trains step 0 at t = M-2: it reads x_{M-1} and aux_{M-2} and
    learns p_{M-1}. A second shift would read x_M and learn p_M instead."""
    model = make_tiny_draft()
    base = _one_mask_batch(model)
    loss, n = _loss0(model, base)
    assert n == 1

    def changed(key, pos):
        b = {k: v.clone() for k, v in base.items()}
        if key == "input_ids":
            b[key][0, pos] = (b[key][0, pos] + 1) % model.config.vocab_size
        else:
            b[key][0, pos] = torch.randn_like(b[key][0, pos]) * 5
        return abs(_loss0(model, b)[0] - loss) > 1e-6

    assert changed("target_logits_draft", M - 1)
    assert not changed("target_logits_draft", M) and not changed("target_logits_draft", M - 2)
    assert changed("input_ids", M - 1) and not changed("input_ids", M)
    assert changed("aux", M - 2) and not changed("aux", M - 1)


def test_loss_mask_is_shifted_with_the_target():
    """Step i at t is masked by loss_mask[t+2+i]: counts follow the mask's positions."""
    model = make_tiny_draft()
    t = 12
    batch = tiny_batch(model.config, b=1, t=t)
    batch["loss_mask"] = torch.zeros(1, t, dtype=torch.uint8)
    batch["loss_mask"][0, [1, 5, 11]] = 1  # position 1 needs t=-1: never trained
    with torch.no_grad():
        r = ttt_forward(model, **batch, ttt_length=5)
    want = [sum(1 for m in (1, 5, 11) if m - 2 - i >= 0) for i in range(5)]
    assert r.counts.tolist() == want == [2, 2, 2, 2, 1]
    # The target used by step i for mask position 11 is p_10 for every i.
    b2 = {k: v.clone() for k, v in batch.items()}
    b2["loss_mask"][0, 5] = 0
    b2["target_logits_draft"][0, :10] = 0.0  # only p_10 (and p_11, never used) stay informative
    with torch.no_grad():
        r2 = ttt_forward(model, **b2, ttt_length=5)
        b2["target_logits_draft"][0, 10] = 0.0
        r3 = ttt_forward(model, **b2, ttt_length=5)
    assert all(abs(a - b) > 1e-6 for a, b in zip(r2.loss_sums.tolist(), r3.loss_sums.tolist()))


def test_positions_whose_target_argmax_is_outside_draft_vocab_are_masked():
    model = make_tiny_draft()
    batch = _one_mask_batch(model)
    batch["target_argmax_in_draft"][0, M - 1] = False
    loss, n = _loss0(model, batch)
    assert (loss, n) == (0.0, 0)
    batch["target_argmax_in_draft"][0, M - 1] = True
    batch["target_argmax_in_draft"][0, M] = False  # a mis-shifted check would drop this one
    assert _loss0(model, batch)[1] == 1


def test_out_of_vocab_positions_count_as_misses_in_the_offline_estimate():
    """Step i at t is eligible where loss_mask[t+2+i] (same sample); of those, the trained ones also need the
    target argmax at t+1+i in the draft vocab. Decoding never proposes an out-of-vocab token, so the estimate's
    hit rate is correct / eligible, not correct / trained (which made the offline tau optimistic)."""
    model = make_tiny_draft()
    t = 12
    batch = tiny_batch(model.config, b=1, t=t)
    batch["loss_mask"] = torch.ones(1, t, dtype=torch.uint8)
    batch["target_argmax_in_draft"][0] = True
    batch["target_argmax_in_draft"][0, 4] = False  # step 0 at t=3, step 1 at t=2, step 2 at t=1
    with torch.no_grad():
        r = ttt_forward(model, **batch, ttt_length=3)
    # eligible: t + 2 + i <= 11, i.e. t = 0 .. 9 - i
    assert r.eligible.tolist() == [10, 9, 8] and r.counts.tolist() == [9, 8, 7]
    m = r.metrics()
    hits = [c / e for c, e in zip(r.correct.tolist(), [10, 9, 8])]
    assert m["sim_accept_len"] == sim_accept_len(hits)
    assert [m[f"in_vocab_{i}"] for i in range(3)] == [0.9, 8 / 9, 7 / 8]
    assert m["acc_0"] == r.correct[0].item() / 9


def test_packed_samples_do_not_see_each_other():
    """Two samples packed in one row (plus padding) give the sums of each alone."""
    model = make_tiny_draft()
    a, b = tiny_batch(model.config, b=1, t=9, seed=3), tiny_batch(model.config, b=1, t=6, seed=4)
    pad = 3
    packed = {k: torch.cat([a[k], b[k], torch.zeros_like(b[k][:, :pad])], dim=1) for k in a}
    seg = torch.tensor([[1] * 9 + [2] * 6 + [0] * pad])
    packed["loss_mask"][0, -pad:] = 1  # padding must not train even when its mask says 1
    with torch.no_grad():
        rp = ttt_forward(model, **packed, segment_ids=seg, ttt_length=3)
        ra, rb = ttt_forward(model, **a, ttt_length=3), ttt_forward(model, **b, ttt_length=3)
    assert torch.equal(rp.counts, ra.counts + rb.counts)
    torch.testing.assert_close(rp.loss_sums, ra.loss_sums + rb.loss_sums, rtol=1e-5, atol=1e-5)
    assert torch.equal(rp.correct, ra.correct + rb.correct)


def test_loss_weights_steps_by_0_8_power():
    model = make_tiny_draft()
    with torch.no_grad():
        r = ttt_forward(model, **tiny_batch(model.config), ttt_length=4)
    per_step = r.loss_sums / r.counts
    assert torch.allclose(r.loss, sum(0.8 ** i * per_step[i] for i in range(4)))
    m = r.metrics()
    assert set(m) >= {"loss", "sim_accept_len", "loss_0", "acc_3", "tokens_3"} and m["tokens_0"] == 20


def test_soft_ce_is_minimal_when_draft_matches_target():
    """If the target equals the draft's own logits, the loss is the draft's entropy and acc is 1."""
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=1, t=10)
    with torch.no_grad():
        logits, _ = model.step(batch["input_ids"][:, 1:], batch["aux"][:, :-1], torch.arange(9)[None])
    batch["target_logits_draft"][:, 1:] = logits
    with torch.no_grad():
        r = ttt_forward(model, **batch, ttt_length=1)
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)[0, :8].sum()
    torch.testing.assert_close(r.loss_sums[0], entropy, rtol=1e-4, atol=1e-4)
    assert r.correct[0] == r.counts[0] == 8


def test_target_from_last_matches_full_logits():
    torch.manual_seed(0)
    model = make_tiny_draft()
    last, head = torch.randn(2, 7, 32), torch.randn(50, 32)
    logits_d, in_draft = target_from_last(last, head, model.d2t, model.t2d, chunk=3)
    full = last @ head.T
    draft_ids = torch.arange(20) + model.d2t
    torch.testing.assert_close(logits_d, full[..., draft_ids])
    assert torch.equal(in_draft, model.t2d[full.argmax(-1)])
    assert in_draft.any() and not in_draft.all()


def test_label_rows_is_the_loss_mask_one_position_earlier():
    """Hand-computed: step i at t reads the label at t+1+i where loss_mask[t+2+i], so label j is read iff
    loss_mask[j+1]; the last position's label is never read."""
    lm = torch.tensor([[0, 0, 1, 1, 0, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.uint8)
    assert label_rows(lm).tolist() == [[False, True, True, False, True, False], [False] * 6]


def test_labels_only_where_read_change_no_loss_or_gradient():
    """Labels computed on the rows a loss reads (the trainer's way) against all rows (the definition): the
    same logits and mask there, and the same TTT loss, counts and gradients, with prompt-only stretches."""
    torch.manual_seed(0)
    model = make_tiny_draft()
    t = 14
    batch = tiny_batch(model.config, b=2, t=t)
    lm = torch.zeros(2, t, dtype=torch.uint8)
    lm[0, 5:9], lm[0, 12:], lm[1, 3:6] = 1, 1, 1  # answers after prompts, a second turn, padding-free rows
    batch["loss_mask"] = lm
    last, head = torch.randn(2, t, 32), torch.randn(50, 32)
    full = target_from_last(last, head, model.d2t, model.t2d)
    rows = label_rows(lm)
    part = target_from_last(last, head, model.d2t, model.t2d, rows=rows)
    assert 0 < int(rows.sum()) < rows.numel()
    torch.testing.assert_close(part[0][rows], full[0][rows])  # a GEMM of fewer rows: rounding only
    assert torch.equal(part[1][rows], full[1][rows]) and not part[1][~rows].any()
    known = target_from_last(last, head, model.d2t, model.t2d, rows=rows, known_in_draft=full[1])
    assert torch.equal(known[1], part[1])
    results = []
    for logits, in_draft in (full, part):
        model.zero_grad()
        b = {**batch, "target_logits_draft": logits, "target_argmax_in_draft": in_draft}
        r = ttt_forward(model, **b, ttt_length=3)
        r.loss.backward()
        results.append((r, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (r_full, g_full), (r_part, g_part) = results
    assert r_full.counts.sum() > 0
    torch.testing.assert_close(r_part.loss, r_full.loss)
    assert torch.equal(r_part.counts, r_full.counts) and torch.equal(r_part.correct, r_full.correct)
    for name in g_full:
        torch.testing.assert_close(g_part[name], g_full[name])


def test_sim_accept_len():
    assert sim_accept_len([1.0, 1.0, 1.0]) == 4.0
    assert sim_accept_len([0.5, 0.5]) == 1.75
    assert sim_accept_len([0.0, 1.0]) == 1.0


def test_global_normalizer_splits_into_micro_batches():
    """With a global normalizer, two half-batches' losses add up to the full batch's."""
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=2, t=10)
    with torch.no_grad():
        full = ttt_forward(model, **batch, ttt_length=3)
        halves = [ttt_forward(model, **{k: v[r:r + 1] for k, v in batch.items()}, ttt_length=3,
                              normalizer=full.counts) for r in (0, 1)]
    torch.testing.assert_close(halves[0].loss + halves[1].loss, full.loss)
