"""The lean CPU forward gives the transformers forward's numbers, layer by layer."""

from __future__ import annotations

import pytest
import torch

from eagle3.extract import lean_llama
from eagle3.extract.capture import TargetCapture


def _llama(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = dict(vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=5, num_attention_heads=6,
               num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=500.0)
    cfg.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    with torch.no_grad():  # random norm weights, so folding them into the GEMMs is exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    return model


def _hf_layers(model, ids, layers):
    with torch.no_grad():
        out = model.model(input_ids=ids, output_hidden_states=True)
    return [out.hidden_states[i + 1] for i in layers], out.last_hidden_state


@pytest.mark.parametrize("overrides", [
    {},
    {"num_key_value_heads": 6},  # plain multi-head attention
    {"head_dim": 16},  # head_dim != hidden / heads
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,  # attention_scaling != 1
                         "original_max_position_embeddings": 16}},
])
def test_matches_transformers_on_a_right_padded_batch(overrides):
    model = _llama(**overrides)
    lean = lean_llama.LeanLlama(model)
    lengths = [37, 12, 29]
    ids = torch.zeros(3, 37, dtype=torch.long)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.randint(3, 300, (n,))
    layers = [0, 2, 3]
    mine, last = lean.forward(ids, layers)
    for r, n in enumerate(lengths):  # each sample alone through HF: padding must not leak into real rows
        ref, ref_last = _hf_layers(model, ids[r:r + 1, :n], layers)
        for a, b in zip(mine, ref):
            assert torch.allclose(a[r, :n], b[0], atol=2e-5, rtol=1e-4)
        assert torch.allclose(last[r, :n], ref_last[0], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(mine[0][0], mine[1][0])  # layers differ: it is not comparing one tensor


def test_interleave_permutation_pairs_rotary_halves():
    perm = lean_llama._interleave(2, 8)
    assert perm.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


@pytest.mark.parametrize("overrides,reason", [
    ({"attention_bias": True}, "biased"),
    ({"mlp_bias": True}, "biased"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    # inv_freq recomputed per batch length: a copy taken at load time would be wrong past max positions
    ({"max_position_embeddings": 32, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0}},
     "rope_type"),
])
def test_unsupported_layouts_fall_back_with_a_reason(overrides, reason):
    model = _llama(**overrides)
    assert reason in lean_llama.supports(model)
    with pytest.raises(ValueError, match=reason):
        lean_llama.LeanLlama(model)


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_capture_uses_the_lean_path_on_cpu_and_agrees_with_transformers(tiny_llama_dir, precision):
    lean = TargetCapture(tiny_llama_dir, "cpu", precision=precision)
    hf = TargetCapture(tiny_llama_dir, "cpu", lean=False, precision=precision)
    assert lean.forward_path == "lean" and hf.forward_path == "transformers (disabled)"
    seqs = [list(range(3, 3 + n)) for n in (9, 40, 23)]
    a1, l1, n1 = lean.forward(seqs)
    a2, l2, n2 = hf.forward(seqs)
    assert n1 == n2 == [9, 40, 23] and a1.shape == a2.shape == (72, 3 * lean.hidden_size)
    if precision == "float32":
        assert torch.allclose(a1, a2, atol=2e-5, rtol=1e-4) and torch.allclose(l1, l2, atol=2e-5, rtol=1e-4)
    else:
        # bf16: the lean forward keeps its residual stream in fp32, transformers' is bf16; both are within
        # bf16 rounding of the fp32 forward, so of each other (measured ~0.3-0.6%: 2^-8 per value, 8 layers).
        ref = TargetCapture(tiny_llama_dir, "cpu", lean=False, precision="float32")
        a3, l3, _ = ref.forward(seqs)
        for got in (a1, a2):
            assert _rel(got, a3) < 2e-2
        for got in (l1, l2):
            assert _rel(got, l3) < 2e-2
        assert _rel(a1, a2) < 2e-2 and _rel(l1, l2) < 2e-2
