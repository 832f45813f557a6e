"""The real SmolLM2-135M through the extract stage (slow: real weights)."""

from __future__ import annotations

import pytest
import torch

from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore, target_logprobs
from eagle3.target import SMOLLM2_ALIAS, load_model, load_tokenizer

from extract_testdata import write_merged


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_smollm2_alias_extracts_default_layers_and_normed_last(tmp_path, smollm2_dir, precision):
    tok = load_tokenizer(SMOLLM2_ALIAS)
    texts = ["def add(a, b):\n    return a + b", "The capital of France is Paris."]
    samples = []
    for i, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        samples.append({"id": f"real{i}", "input_ids": ids, "loss_mask": [1] * len(ids)})
    summary = extract(ExtractConfig(merged=write_merged(tmp_path / "m", samples), model=SMOLLM2_ALIAS,
                                    out=str(tmp_path / "s"), device="cpu", precision=precision))
    store = HiddenStateStore(summary["store"])
    assert store.aux_layers == [1, 14, 26] and store.hidden_size == 576  # 30 layers: [1, L/2-1, L-4]
    assert summary["bytes_per_token"] == 8 * 576 + 5
    model = load_model(SMOLLM2_ALIAS, "cpu", precision="float32")  # the reference: fp32, whatever extract ran in
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([samples[0]["input_ids"]])).logits[0]
    logp = target_logprobs(store.get("real0"), model.lm_head.weight)
    # the stored (bf16) `last`, computed in either precision, reproduces the fp32 target's choice and distribution
    assert (logp.argmax(-1) == logits.argmax(-1)).float().mean() >= 0.9
    assert torch.allclose(logp.exp(), torch.softmax(logits, -1), atol=0.02)
