"""The demo corpus through the real data path: tokenize (SmolLM2's tokenizer) -> merge -> verify -> vocab."""

from __future__ import annotations

import json

import pytest

from eagle3.demo.corpus import write_demo_corpus
from eagle3.merge import MergeConfig, merge
from eagle3.verify import VerifyConfig, verify
from eagle3.vocab import VocabConfig, vocab


@pytest.mark.slow
def test_demo_corpus_through_merge_verify_and_vocab(tmp_path, smollm2_dir):
    from eagle3.tokenize import TokenizeConfig, tokenize

    manifest = write_demo_corpus(str(tmp_path / "demo"), scale=0.3, seed=42)
    stats = tokenize(TokenizeConfig(manifest=manifest, model=smollm2_dir, out=str(tmp_path / "prep")))["datasets"]
    prep = {name: json.loads((tmp_path / "prep" / name / "stats.json").read_text()) for name in stats}
    assert prep["instructions"]["rejected"] == 2 and sum(p["rejected"] for p in prep.values()) == 2
    tokens = {n: p["tokens"] for n, p in prep.items()}
    samples = {n: p["samples"] for n, p in prep.items()}
    # long_reports plays A1: few samples, many tokens.
    assert samples["long_reports"] / sum(samples.values()) < 0.1
    assert 0.2 < tokens["long_reports"] / sum(tokens.values()) < 0.45

    summary = merge(MergeConfig(prepared=str(tmp_path / "prep"), out=str(tmp_path / "merged"), max_seq_len=512,
                                seed=42))
    man = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    assert man["vocab_size"] == 49152 and man["tokenizer_fingerprint"]
    assert man["sources"]["long_reports"]["truncated"]["samples"] == samples["long_reports"]  # all > 512 tokens
    result = verify(VerifyConfig(str(tmp_path / "merged"), model=smollm2_dir))
    assert result["passed"] and result["samples"] == summary["samples"]

    info = vocab(VocabConfig(merged=str(tmp_path / "merged"), out=str(tmp_path / "vocab"), draft_vocab_size=256))
    assert info["vocab_size"] == 49152 and info["fill"]["from_loss_tokens"] == min(256, info["distinct_tokens"])
    assert 0.9 < info["coverage"] <= 1.0
