"""V is the target's lm_head rows (config.json vocab_size), not len(tokenizer), in every stage.

The target is the tiny Llama padded 64 rows past its tokenizer (as Qwen pads 151,665 tokens
to 151,936 rows): tokenize, merge, vocab, extract, train and export must all agree on
V = len(tokenizer) + 64, and t2d must cover every lm_head row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3 import target
from eagle3.errors import InputError


def _messages(path: Path, n: int = 24) -> str:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [
                {"role": "user", "content": f"Count from {i} to {i + 5}."},
                {"role": "assistant", "content": " ".join(str(k) for k in range(i, i + 6))},
            ]}) + "\n")
    return str(path)


def test_config_vocab_size_reads_lm_head_rows_and_text_config():
    assert target.config_vocab_size({"vocab_size": 151936}) == 151936
    assert target.config_vocab_size({"text_config": {"vocab_size": 262208}}) == 262208  # multimodal (Gemma 3 4B+)
    with pytest.raises(InputError, match="no positive integer vocab_size"):
        target.config_vocab_size({"hidden_size": 8}, "m/config.json")


def test_every_stage_takes_v_from_config_json_not_the_tokenizer(padded_tiny_llama_dir, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from eagle3.export import ExportConfig, export
    from eagle3.extract import ExtractConfig, extract
    from eagle3.extract.store import HiddenStateStore
    from eagle3.merge import MergeConfig, merge
    from eagle3.tokenize.stage import DatasetConfig, tokenize_dataset
    from eagle3.train import TrainConfig, train
    from eagle3.vocab import VocabConfig, vocab

    model = padded_tiny_llama_dir
    n_tokens = len(AutoTokenizer.from_pretrained(model))
    v = target.vocab_size(model)
    assert v == n_tokens + 64

    tokenize_dataset(DatasetConfig(name="chat", source=_messages(tmp_path / "chat.jsonl"), format="messages",
                                    tokenizer=model, out=str(tmp_path / "prep")))
    assert json.loads((tmp_path / "prep/chat/stats.json").read_text())["vocab_size"] == v
    merge(MergeConfig(prepared=str(tmp_path / "prep"), out=str(tmp_path / "merged"), max_seq_len=256))
    assert json.loads((tmp_path / "merged/manifest.json").read_text())["vocab_size"] == v
    info = vocab(VocabConfig(merged=str(tmp_path / "merged"), out=str(tmp_path / "vocab"), draft_vocab_size=32))
    assert info["vocab_size"] == v
    assert load_file(str(tmp_path / "vocab/vocab.safetensors"))["t2d"].shape == (v,)

    extract(ExtractConfig(merged=str(tmp_path / "merged"), model=model, out=str(tmp_path / "store"), device="cpu"))
    (store_dir,) = [p for p in (tmp_path / "store").iterdir() if (p / "store.json").exists()]
    assert HiddenStateStore(str(store_dir)).info["vocab_size"] == v
    train(TrainConfig(store=str(store_dir), vocab=str(tmp_path / "vocab"), out=str(tmp_path / "ckpt"),
                      merged=str(tmp_path / "merged"), model=model, max_steps=2, ttt_length=2, device="cpu",
                      heldout_share=0.0, eval_every=0))
    export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft")))
    config = json.loads((tmp_path / "draft/config.json").read_text())
    tensors = load_file(str(tmp_path / "draft/model.safetensors"))
    assert config["vocab_size"] == v and tensors["t2d"].shape == (v,) and tensors["t2d"].dtype == torch.bool
    assert int(tensors["t2d"].sum()) == config["draft_vocab_size"] == 32


def test_a_tokenizer_larger_than_the_lm_head_is_refused(tiny_llama_dir, tmp_path):
    import shutil

    from eagle3.tokenize.stage import DatasetConfig, tokenize_dataset

    small = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, small)
    cfg = json.loads((small / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (small / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="has 49152 tokens but config.json vocab_size .* is 1000"):
        tokenize_dataset(DatasetConfig(name="chat", source=_messages(tmp_path / "chat.jsonl"), format="messages",
                                        tokenizer=str(small), out=str(tmp_path / "prep")))


def test_default_aux_layers_are_valid_for_small_targets_and_unchanged_for_real_ones():
    from eagle3.errors import InputError
    from eagle3.target import default_aux_layers, resolve_aux_layers

    # EAGLE-3's [1, L/2-1, L-4], hand-computed for real depths (SmolLM2 30 layers, Llama-3-8B 32, Kimi-K2 61)
    assert [default_aux_layers(n) for n in (30, 32, 61)] == [[1, 14, 26], [1, 15, 28], [1, 29, 57]]
    # Below 4 layers the formula leaves [0, L-2]: clamped, so a 2- or 3-layer test target extracts by default.
    assert [resolve_aux_layers(None, n, "m") for n in (2, 3, 4)] == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]
    with pytest.raises(InputError, match="at least 2"):
        resolve_aux_layers(None, 1, "m")
