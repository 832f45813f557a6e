"""Tiny random Llamas with a real tokenizer, for the fixtures (tests/conftest.py) and the tests that need another
shape of them."""

from __future__ import annotations

import shutil
from pathlib import Path

TINY_LLAMA = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
"""SmolLM2's vocabulary and special tokens, 8 layers of width 64."""


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA, **overrides})


def save_random_llama(out: str | Path, cfg, tokenizer_dir: str) -> str:
    """A random LlamaForCausalLM of ``cfg`` (seed 0) saved at ``out``, with the tokenizer files
    (eagle3.target.tokenizer_files) of ``tokenizer_dir``."""
    import torch
    from transformers import LlamaForCausalLM

    from eagle3.target import tokenizer_files

    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    for path in tokenizer_files(tokenizer_dir):
        dest = Path(out, path.relative_to(tokenizer_dir))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest)
    return str(out)
