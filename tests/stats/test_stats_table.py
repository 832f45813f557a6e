"""Stats table: per-dataset numbers, shares, and the A1-style flag with its extraction cost."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3 import storage, storage_options
from eagle3.cli import main
from eagle3.errors import InputError
from eagle3.stats import StatsConfig, compute_stats, format_table, stats


def write_dataset(prep, name: str, lengths: list[int], category: str = "chat") -> None:
    folder = prep / name
    folder.mkdir(parents=True)
    ids = [list(range(n)) for n in lengths]
    masks = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    pq.write_table(pa.table({
        "id": [f"{name}{i}" for i in range(len(lengths))],
        "input_ids": pa.array(ids, pa.list_(pa.int32())), "loss_mask": pa.array(masks, pa.list_(pa.uint8())),
        "num_tokens": pa.array(lengths, pa.int32()),
        "num_loss_tokens": pa.array([n - n // 2 for n in lengths], pa.int32()),
        "source": [name] * len(lengths)}), folder / "tokenized.parquet")
    (folder / "stats.json").write_text(json.dumps({"category": category, "rejected": 1}))


@pytest.fixture
def prep(tmp_path):
    # The seed's A1 case: 7% of the samples, 32% of the tokens.
    write_dataset(tmp_path, "a1", [400] * 6 + [4700], category="long")
    write_dataset(tmp_path, "b", [160] * 50)
    write_dataset(tmp_path, "c", [100, 120, 140, 160, 180] * 8 + [160, 160, 160])
    write_dataset(tmp_path, "d", [500, 500])  # 2x its sample share, but only ~4% of the tokens
    return tmp_path


def test_numbers_shares_and_flag(prep):
    result = compute_stats(StatsConfig(str(prep), max_seq_len=4096, hidden_size=7168, tokens_per_s=10_000))
    rows = {r["dataset"]: r for r in result["datasets"]}
    a1 = rows["a1"]
    lengths = np.array([400] * 6 + [4700])
    assert (a1["samples"], a1["tokens"], a1["tokens_max"]) == (7, 7100, 4700)
    assert a1["tokens_mean"] == pytest.approx(lengths.mean())
    assert a1["tokens_p50"] == pytest.approx(np.percentile(lengths, 50))
    assert a1["tokens_p95"] == pytest.approx(np.percentile(lengths, 95))
    assert a1["loss_tokens"] == 6 * 200 + 2350
    assert a1["at_cap_share"] == pytest.approx(1 / 7)
    assert a1["category"] == "long" and a1["rejected"] == 1
    total_tokens = 7100 + 50 * 160 + sum([100, 120, 140, 160, 180]) * 8 + 480 + 1000
    assert result["totals"]["tokens"] == total_tokens
    assert a1["sample_share"] == pytest.approx(7 / 102)
    assert a1["token_share"] == pytest.approx(7100 / total_tokens)
    assert [f["dataset"] for f in result["flags"]] == ["a1"]
    flag = result["flags"][0]
    # truncated at max_seq_len; plus one int64 offset per sample (storage_options.stored_bytes)
    assert flag["extract_bytes"] == (6 * 400 + 4096) * (8 * 7168 + 5) + 8 * 7
    assert flag["extract_hours"] == pytest.approx((6 * 400 + 4096) / 10_000 / 3600)
    assert "6.9% of samples but 32.0% of tokens" in flag["message"]
    assert rows["d"]["token_share"] >= 2 * rows["d"]["sample_share"] and not rows["d"]["flagged"]


def test_the_storage_option_prices_the_extraction(prep):
    """Hand-computed bytes per token of each option (DESIGN: bf16 8H; fp8 4H+8; fp8-topk 3H+6+6*16), +5 id/mask."""
    h = 7168
    for option, per_token in (("bf16", 8 * h + 5), ("fp8", 4 * h + 8 + 5), ("fp8-topk", 3 * h + 102 + 5)):
        result = compute_stats(StatsConfig(str(prep), max_seq_len=4096, hidden_size=h, storage_option=option),
                               write=False)
        assert result["bytes_per_token"] == per_token
        assert result["flags"][0]["extract_bytes"] == (6 * 400 + 4096) * per_token + 8 * 7
        # The total is what the verify gate and extract estimate for the same tokens and samples.
        tokens = sum(min(n, 4096) for n in [400] * 6 + [4700]) + 50 * 160 + (700 * 8 + 480) + 1000
        gate = storage_options.extraction_estimate(option, h, tokens, 102)
        assert result["totals"]["extract_bytes"] == gate["bytes"] == tokens * per_token + 8 * (102 + 1)


def test_files_and_table(prep):
    result = compute_stats(StatsConfig(str(prep)))
    saved = json.loads((prep / "stats_table.json").read_text())
    assert saved["flags"] == json.loads(json.dumps(result["flags"]))
    text = (prep / "stats_table.txt").read_text()
    assert text.strip() == format_table(result)
    header = text.splitlines()[0].split()
    assert header[:4] == ["dataset", "samples", "tokens", "mean"] and "%tokens" in header
    assert "FLAG a1:" in text and "<-- FLAG" in text.splitlines()[1]


def test_cli_prints_table(prep, capsys):
    assert main(["stats", "--prepared", str(prep), "--hidden-size", "576"]) == 0
    out = capsys.readouterr().out
    assert "FLAG a1" in out and "H=576" in out and "bf16: 4613 B/token" in out


def test_empty_prepared_folder(tmp_path):
    with pytest.raises(InputError, match="run `eagle3 tokenize` first"):
        compute_stats(StatsConfig(str(tmp_path)))


def test_stats_on_s3(prep, s3_bucket):
    for name in ("a1", "b"):
        for f in ("tokenized.parquet", "stats.json"):
            storage.put_file(prep / name / f, f"{s3_bucket}/prep/{name}/{f}")
    result = compute_stats(StatsConfig(f"{s3_bucket}/prep"))
    assert [r["dataset"] for r in result["datasets"]] == ["a1", "b"]
    assert storage.exists(f"{s3_bucket}/prep/stats_table.txt")


def test_stats_reads_hidden_size_and_copies_to_out(prep, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 64}))
    result = stats(StatsConfig(str(prep), max_seq_len=4096, model=str(model), out=str(tmp_path / "run" / "stats")))
    assert result["hidden_size"] == 64 and result["bytes_per_token"] == 8 * 64 + 5
    saved = json.loads((tmp_path / "run" / "stats" / "stats_table.json").read_text())
    assert saved["flags"][0]["dataset"] == "a1"
    assert (tmp_path / "run" / "stats" / "stats_table.txt").read_text().strip() == format_table(result)


def test_a_manifest_limits_the_table_to_its_datasets(prep, tmp_path):
    """The prepared folder is shared between runs (the demo's datasets stay there): with a manifest, as the DAG
    passes its run's, only that manifest's datasets are counted, and another dataset's damaged file is not read."""
    import yaml

    # b is another run's, and its file no longer matches the checksum its stats.json records
    (prep / "b" / "stats.json").write_text(json.dumps({"tokenized_sha256": "0" * 64}))
    with pytest.raises(InputError, match="checksum"):
        compute_stats(StatsConfig(str(prep)), write=False)  # without a manifest: every dataset, as before
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"datasets": [
        {"name": n, "source": f"{n}.jsonl", "format": "messages"} for n in ("a1", "d")]}))
    result = compute_stats(StatsConfig(str(prep), manifest=str(manifest), max_seq_len=4096), write=False)
    assert [r["dataset"] for r in result["datasets"]] == ["a1", "d"]
    assert result["totals"]["samples"] == 7 + 2 and result["datasets"][0]["sample_share"] == pytest.approx(7 / 9)
    manifest.write_text(yaml.safe_dump({"datasets": [{"name": "zeta", "source": "z.jsonl", "format": "messages"}]}))
    with pytest.raises(InputError, match=r"\['zeta'\] have no tokenized.parquet"):
        compute_stats(StatsConfig(str(prep), manifest=str(manifest)), write=False)
