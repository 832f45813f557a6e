"""Loss denominators from the data, top-k targets, and split invariance of the gradient."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft import DraftConfig, Eagle3Draft
from eagle3.train import data, objective


def _tiny_draft(v=50, vd=50, h=16):
    cfg = DraftConfig(hidden_size=h, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=128,
                      vocab_size=v, draft_vocab_size=vd, aux_layers=(1, 2, 3))
    torch.manual_seed(0)
    d2t = torch.zeros(vd, dtype=torch.long)
    return Eagle3Draft(cfg, torch.randn(v, h), d2t, torch.ones(v, dtype=torch.bool))


class _Store:
    """In-memory stand-in for a SampleSource's get_many (the loop tests use the real store)."""

    def __init__(self, lengths, h=16, v=50):
        g = torch.Generator().manual_seed(1)
        self.samples = {
            sid: {"aux": torch.randn(n, 3 * h, generator=g), "input_ids": torch.randint(0, v, (n,), generator=g),
                  "loss_mask": (torch.rand(n, generator=g) > 0.3).to(torch.uint8),
                  "target": torch.randn(n, v, generator=g) * 3}
            for sid, n in lengths.items()
        }

    def get(self, sid):
        return self.samples[sid]

    def get_many(self, ids):
        return [self.samples[s] for s in ids]


def _grads(draft, store, lengths, micro_tokens, ttt_length=3):
    ids = sorted(lengths)
    denom = objective.step_denominators([store.get(s)["loss_mask"] for s in ids], ttt_length)
    draft.zero_grad()
    counts = torch.zeros(ttt_length)
    for mb in data.micro_batches(ids, lengths, micro_tokens):
        batch = data.collate(store, mb)
        res = objective.ttt_sums(draft, batch, batch["target"], torch.ones_like(batch["input_ids"], dtype=torch.bool),
                                 denom, ttt_length)
        res.loss.backward()
        counts += res.counts
    return [p.grad.clone() for p in draft.parameters()], counts, denom


def test_denominators_equal_trained_positions_when_all_targets_are_in_vocab():
    lengths = {f"s{i}": n for i, n in enumerate([5, 9, 3, 12, 7])}
    _, counts, denom = _grads(_tiny_draft(), _Store(lengths), lengths, 1000)
    assert torch.equal(counts.double(), denom)


def test_gradient_is_the_same_for_any_micro_batch_split():
    lengths = {f"s{i}": n for i, n in enumerate([5, 9, 3, 12, 7, 10])}
    store, draft = _Store(lengths), _tiny_draft()
    whole, _, _ = _grads(draft, store, lengths, 1000)
    split, _, _ = _grads(draft, store, lengths, 20)
    assert len(data.micro_batches(sorted(lengths), lengths, 20)) > 2
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_topk_targets_map_target_ids_into_the_draft_vocab():
    v, d2t = 10, torch.tensor([2, 3, 4]) - torch.arange(3)  # draft vocab = target ids 2, 3, 4
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[[2, 3, 4]] = True
    batch = {"topk_ids": torch.tensor([[[3, 7, 2], [9, 4, 1]]]),
             "topk_logprobs": torch.tensor([[[-0.1, -2.0, -3.0], [-0.2, -1.0, -4.0]]])}
    logits, in_draft = objective.targets(batch, None, d2t, t2d)
    assert logits.shape == (1, 2, 3)
    assert logits[0, 0, 1] == -0.1 and logits[0, 0, 0] == -3.0 and logits[0, 0, 2] < -1e8
    assert logits[0, 1, 2] == -1.0
    assert in_draft.tolist() == [[True, False]]  # row 2's top-1 (id 9) is outside the draft vocab


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_soft_labels_are_fp32_under_bf16_autocast(device):
    """The training step runs under bf16 autocast (on CUDA); the target's logits, hence the
    soft labels and the in-draft mask, must still be the fp32 ones. CPU autocast casts
    matmul to bf16 just as CUDA's does, so it shows the difference here; on a GPU the CUDA
    case runs the same check under CUDA autocast."""
    from eagle3.extract.codec import target_logprobs

    g = torch.Generator().manual_seed(0)
    v, vd, h = 64, 16, 32
    last = torch.randn(2, 8, h, generator=g).to(torch.bfloat16).to(device)  # the bf16 store's `last`
    head = torch.randn(v, h, generator=g).to(device)
    chosen = torch.randperm(v, generator=g)[:vd].sort().values
    d2t, t2d = chosen - torch.arange(vd), torch.zeros(v, dtype=torch.bool)
    t2d[chosen] = True
    d2t, t2d = d2t.to(device), t2d.to(device)
    batch = {"last": last}
    ref_logits, ref_in = objective.targets(batch, head, d2t, t2d)
    with torch.autocast(device, dtype=torch.bfloat16):
        assert (last[0].float() @ head.T).dtype == torch.bfloat16  # autocast is really on for matmul
        logits, in_draft = objective.targets(batch, head, d2t, t2d)
        logp = target_logprobs({"last": last[0]}, head)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, ref_logits)
    assert torch.equal(logits.softmax(-1), ref_logits.softmax(-1))  # the soft labels themselves
    assert torch.equal(in_draft, ref_in)
    assert logp.dtype == torch.float32
    assert torch.equal(logp, target_logprobs({"last": last[0]}, head))


def test_extraction_lm_head_is_fp32_under_bf16_autocast(tiny_llama_dir):
    """fp8-topk's stored soft labels come from TargetCapture.lm_head: fp32 logits even if a caller
    runs extraction inside a bf16 autocast region (CPU autocast as the stand-in for CUDA's)."""
    from eagle3.extract.capture import TargetCapture

    cap = TargetCapture(tiny_llama_dir, precision="float32")
    hidden = torch.randn(5, cap.hidden_size)
    ref = cap.lm_head(hidden)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = cap.lm_head(hidden)
    assert got.dtype == torch.float32 and torch.equal(got, ref)


def test_known_in_draft_skips_the_full_head_and_changes_no_bit():
    """The trainer keeps each sample's in-draft mask after its first micro-batch (InDraftCache): with it, the
    soft labels are the same bits and the mask is read, not recomputed (a wrong mask passed in comes back)."""
    g = torch.Generator().manual_seed(1)
    v, vd, h = 64, 16, 32
    last = torch.randn(2, 8, h, generator=g)
    head = torch.randn(v, h, generator=g)
    chosen = torch.randperm(v, generator=g)[:vd].sort().values
    d2t, t2d = chosen - torch.arange(vd), torch.zeros(v, dtype=torch.bool)
    t2d[chosen] = True
    logits, in_draft = objective.targets({"last": last}, head, d2t, t2d)
    assert torch.equal(in_draft, t2d[(last @ head.T).argmax(-1)])  # hand-computed full-vocab argmax
    torch.testing.assert_close(logits, (last @ head.T)[..., chosen])
    cache = objective.InDraftCache()
    attention = torch.tensor([[True] * 8, [True] * 5 + [False] * 3])
    assert cache.get(["a", "b"], 8) is None
    cache.put(["a", "b"], in_draft, attention)
    known = cache.get(["b", "a"], 9)
    assert known.shape == (2, 9) and torch.equal(known[1, :8], in_draft[0]) and not known[0, 5:].any()
    assert torch.equal(known[0, :5], in_draft[1, :5])
    again, mask = objective.targets({"last": last}, head, d2t, t2d, known_in_draft=~in_draft)
    assert torch.equal(again, logits) and torch.equal(mask, ~in_draft)
