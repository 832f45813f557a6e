"""An extract task records its engine's measured speed beside the store; the next gate reads it (eagle3/rates.py)."""

from __future__ import annotations

from eagle3 import rates
from eagle3.extract import ExtractConfig, extract

from extract_testdata import make_samples, write_merged


def test_extract_records_its_rate_per_engine_and_task(tmp_path, tiny_llama_dir):
    merged, out = write_merged(tmp_path / "m", make_samples(10, seed=7)), str(tmp_path / "store")
    for shard in ("0/2", "1/2"):
        summary = extract(ExtractConfig(merged=merged, model=tiny_llama_dir, out=out, device="cpu", shard=shard,
                                        token_budget=256, shard_mb=1, progress_every_s=0))
        assert summary["tokens"] > 0
    got = rates.measured(out, tiny_llama_dir)
    assert set(got) == {"transformers"} and got["transformers"]["tasks"] == 2
    assert got["transformers"]["tokens"] == sum(len(s["input_ids"]) for s in make_samples(10, seed=7))
    assert got["transformers"]["tokens_per_s"] > 0
    assert rates.measured(out, "another-model") == {}
