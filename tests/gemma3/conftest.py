"""A tiny random Gemma 3 text model: Gemma's layer (sandwich norms, 1 + w RMSNorm, q/k norms, GELU),
scaled tied embedding and sliding-window + full attention with two rope bases, at a size a unit
test runs in seconds. The window is 8 so decodes of a few dozen tokens cross it."""

from __future__ import annotations

import pytest

SLIDING_WINDOW = 8


def tiny_gemma3(seed: int = 0, vocab_size: int = 512):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, sliding_window=SLIDING_WINDOW, max_position_embeddings=1024,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], query_pre_attn_scalar=16,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = Gemma3ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # Gemma initialises norms at 0 (scale 1): make them visible
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape) * 0.3)
    return model


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tiny-gemma3")
    tiny_gemma3().save_pretrained(out, safe_serialization=True)
    return str(out)
