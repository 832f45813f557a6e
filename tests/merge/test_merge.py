"""Merge stage: drop list, truncation with the mask, no-loss and duplicate drops,
a shuffle that depends only on data and seed, bounded-memory buckets, exports."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from eagle3 import storage
from eagle3.cli import main as cli_main
from eagle3.datasets.samples import content_id
from eagle3.errors import InputError
from eagle3.merge import MergeConfig, merge
from eagle3.merge.arrays import DROP_DUPLICATE, DROP_NO_LOSS, DROP_TRUNCATED_NO_LOSS
from tests.merge.prepared_factory import random_rows, write_prepared


def read_out(out):
    return pq.read_table(os.path.join(out, "train.parquet")).to_pydict()


def test_truncates_ids_and_mask_together(tmp_path):
    ids, mask = list(range(100, 120)), [0] * 5 + [1] * 15
    prep = write_prepared(tmp_path / "prep", {"a": [(ids, mask)]})
    summary = merge(MergeConfig(prepared=prep, out=str(tmp_path / "m"), max_seq_len=8))
    out = read_out(tmp_path / "m")
    assert out["input_ids"] == [ids[:8]] and out["loss_mask"] == [mask[:8]]
    assert out["num_tokens"] == [8] and out["num_loss_tokens"] == [3]
    assert out["id"] == [content_id(np.array(ids[:8]), np.array(mask[:8]))]
    assert out["source_id"] == [content_id(np.array(ids), np.array(mask))]
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert man["sources"]["a"]["truncated"] == {"samples": 1, "tokens_cut": 12, "loss_tokens_cut": 12}
    assert summary["tokens"] == 8 and man["max_seq_len"] == 8


def test_sample_with_no_loss_left_after_truncation_is_dropped_and_counted(tmp_path):
    # Known bug of other trainers: truncation keeps a sample whose loss tokens were all cut.
    late = (list(range(30)), [0] * 20 + [1] * 10)
    none = (list(range(5)), [0] * 5)
    ok = (list(range(7, 12)), [0, 1, 1, 1, 1])
    prep = write_prepared(tmp_path / "prep", {"a": [late, none, ok]})
    merge(MergeConfig(prepared=prep, out=str(tmp_path / "m"), max_seq_len=16))
    out = read_out(tmp_path / "m")
    assert out["input_ids"] == [ok[0]]
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    src = man["sources"]["a"]
    assert src["dropped"] == {DROP_TRUNCATED_NO_LOSS: 1, DROP_NO_LOSS: 1}
    assert src["samples_in"] == 3 and src["samples_out"] == 1
    assert sorted(d["reason"] for d in man["drops"]) == sorted([DROP_TRUNCATED_NO_LOSS, DROP_NO_LOSS])
    assert {d["id"] for d in man["drops"]} == {content_id(np.array(late[0]), np.array(late[1])),
                                               content_id(np.array(none[0]), np.array(none[1]))}


def test_exact_duplicates_removed_and_counted_per_source(tmp_path):
    x = ([1, 2, 3], [0, 1, 1])
    same_ids_other_mask = ([1, 2, 3], [0, 0, 1])
    y = ([4, 5, 6], [1, 1, 1])
    prep = write_prepared(tmp_path / "prep", {"a": [x, x, y], "b": [x, same_ids_other_mask]})
    merge(MergeConfig(prepared=prep, out=str(tmp_path / "m")))
    out = read_out(tmp_path / "m")
    assert sorted(zip(map(tuple, out["input_ids"]), map(tuple, out["loss_mask"]))) == sorted(
        [((1, 2, 3), (0, 1, 1)), ((1, 2, 3), (0, 0, 1)), ((4, 5, 6), (1, 1, 1))])
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    # The copy from the first source name ("a") is kept; the others are counted where they came from.
    assert man["sources"]["a"]["dropped"] == {DROP_DUPLICATE: 1}
    assert man["sources"]["b"]["dropped"] == {DROP_DUPLICATE: 1}
    assert man["totals"]["dropped"] == {DROP_DUPLICATE: 2}
    assert out["source"].count("a") == 2 and out["source"].count("b") == 1


def test_drop_list_and_dataset_selection_are_recorded(tmp_path):
    rng = np.random.default_rng(1)
    prep = write_prepared(tmp_path / "prep", {n: random_rows(rng, 6) for n in ("a", "b", "c")})
    merge(MergeConfig(prepared=prep, out=str(tmp_path / "m"), drop="b", datasets=["a", "b"]))
    out = read_out(tmp_path / "m")
    assert set(out["source"]) == {"a"}
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert [(d["name"], d["samples"]) for d in man["dropped_datasets"]] == [("b", 6)]
    assert set(man["sources"]) == {"a"}
    with pytest.raises(InputError, match=r"--drop names unknown dataset\(s\) \['zz'\]"):
        merge(MergeConfig(prepared=prep, out=str(tmp_path / "m2"), drop=["zz"]))


def test_shuffle_depends_only_on_data_and_seed(tmp_path):
    rng = np.random.default_rng(2)
    data = {"a": random_rows(rng, 40), "b": random_rows(rng, 25), "c": random_rows(rng, 30)}
    p1 = write_prepared(tmp_path / "p1", data)
    # Same samples, other file order and other dataset folder names' creation order.
    p2 = write_prepared(tmp_path / "p2", {k: list(reversed(v)) for k, v in reversed(list(data.items()))})
    s1 = merge(MergeConfig(prepared=p1, out=str(tmp_path / "m1"), seed=7, max_seq_len=20))
    s2 = merge(MergeConfig(prepared=p2, out=str(tmp_path / "m2"), seed=7, max_seq_len=20, batch_rows=3,
                           bucket_mb=0.0005))  # many small batches and shuffle buckets
    s3 = merge(MergeConfig(prepared=p1, out=str(tmp_path / "m3"), seed=8, max_seq_len=20))
    assert json.loads((tmp_path / "m2" / "manifest.json").read_text())["buckets"] > 3
    o1, o2, o3 = (read_out(tmp_path / m) for m in ("m1", "m2", "m3"))
    assert o1["id"] == o2["id"] and o1["input_ids"] == o2["input_ids"]
    assert s1["content_hash"] == s2["content_hash"] != s3["content_hash"]
    assert sorted(o1["id"]) == sorted(o3["id"]) and o1["id"] != o3["id"]
    in_order = [s for s in ("a", "b", "c") for _ in range(o1["source"].count(s))]
    assert o1["source"] != in_order


def test_export_jsonl_is_the_seed_format_in_output_order(tmp_path):
    rng = np.random.default_rng(3)
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(rng, 12), "b": random_rows(rng, 9)})
    merge(MergeConfig(prepared=prep, out=str(tmp_path / "m"), export_jsonl=True, max_seq_len=10))
    out = read_out(tmp_path / "m")
    lines = [json.loads(x) for x in (tmp_path / "m" / "train.jsonl").read_text().splitlines()]
    assert [set(x) for x in lines] == [{"input_ids", "loss_mask"}] * len(out["id"])
    assert [x["input_ids"] for x in lines] == out["input_ids"]
    assert [x["loss_mask"] for x in lines] == out["loss_mask"]
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert man["checksums"]["train.jsonl"] == storage.sha256_file(tmp_path / "m" / "train.jsonl")


def test_mismatched_mask_length_names_the_file_and_sample(tmp_path):
    import pyarrow as pa

    os.makedirs(tmp_path / "prep" / "a")
    table = pa.table({"id": ["x1"], "input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32())),
                      "loss_mask": pa.array([[1, 1]], pa.list_(pa.uint8()))})
    pq.write_table(table, tmp_path / "prep" / "a" / "tokenized.parquet")
    with pytest.raises(InputError, match=r"tokenized\.parquet: sample id x1: input_ids has 3 tokens but loss_mask 2"):
        merge(MergeConfig(prepared=str(tmp_path / "prep"), out=str(tmp_path / "m")))


def test_config_refuses_bad_values(tmp_path):
    with pytest.raises(InputError, match="max_seq_len must be >= 1"):
        MergeConfig(prepared="p", out="o", max_seq_len=0)
    with pytest.raises(InputError, match="no <dataset>/tokenized.parquet"):
        merge(MergeConfig(prepared=str(tmp_path / "empty"), out=str(tmp_path / "m")))


def test_cli_merge_writes_the_merged_folder(tmp_path, capsys):
    rng = np.random.default_rng(4)
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(rng, 5), "b": random_rows(rng, 5)})
    rc = cli_main(["merge", "--prepared", prep, "--out", str(tmp_path / "m"), "--max-seq-len", "16",
                   "--seed", "3", "--drop", "b", "--export-jsonl"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] == 5 and summary["dropped_datasets"] == ["b"]
    assert sorted(os.listdir(tmp_path / "m")) == ["manifest.json", "train.jsonl", "train.parquet"]


def test_merge_reads_and_writes_s3(tmp_path, s3_bucket):
    rng = np.random.default_rng(5)
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(rng, 8)})
    for rel in storage.list_files(prep):
        storage.put_file(os.path.join(prep, rel), f"{s3_bucket}/prep/{rel}")
    summary = merge(MergeConfig(prepared=f"{s3_bucket}/prep", out=f"{s3_bucket}/merged", max_seq_len=12))
    assert storage.list_files(f"{s3_bucket}/merged") == ["manifest.json", "train.parquet"]
    man = storage.read_json(f"{s3_bucket}/merged/manifest.json")
    assert man["content_hash"] == summary["content_hash"] and man["totals"]["samples_out"] == 8


def test_a_damaged_prepared_dataset_is_refused(tmp_path):
    rng = np.random.default_rng(2)
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(rng, 10), "b": random_rows(rng, 10)})
    for name in ("a", "b"):  # as tokenize records it
        stats_path = os.path.join(prep, name, "stats.json")
        stats = storage.read_json(stats_path)
        stats["tokenized_sha256"] = storage.sha256_file(os.path.join(prep, name, "tokenized.parquet"))
        storage.write_json(stats_path, stats)
    merge(MergeConfig(prepared=prep, out=str(tmp_path / "ok"), max_seq_len=32))
    table = pq.read_table(os.path.join(prep, "b", "tokenized.parquet"))
    pq.write_table(table.slice(0, 9), os.path.join(prep, "b", "tokenized.parquet"))  # a row lost
    with pytest.raises(InputError, match=r"b/tokenized.parquet.*differs from stats.json.*re-run `eagle3 tokenize`"):
        merge(MergeConfig(prepared=prep, out=str(tmp_path / "bad"), max_seq_len=32))


def test_an_error_in_the_bucket_phase_leaves_no_temporary_file(tmp_path, monkeypatch):
    import tempfile

    from eagle3.merge import stage

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmpdir"))
    (tmp_path / "tmpdir").mkdir()
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(np.random.default_rng(1), 20)})

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")
    monkeypatch.setattr(stage, "list_parts", broken)  # only the bucket phase calls it, with train.parquet open
    with pytest.raises(RuntimeError, match="disk full"):
        merge(MergeConfig(prepared=prep, out=str(tmp_path / "out"), max_seq_len=32, export_jsonl=True))
    assert os.listdir(tmp_path / "out") == [] and os.listdir(tmp_path / "tmpdir") == []


def test_readers_after_the_gate_refuse_a_changed_train_parquet(tmp_path):
    from eagle3.merge.stage import checked_train_parquet
    from eagle3.vocab import VocabConfig, vocab

    prep = write_prepared(tmp_path / "prep", {"a": random_rows(np.random.default_rng(3), 20)})
    out = str(tmp_path / "out")
    merge(MergeConfig(prepared=prep, out=out, max_seq_len=32))
    assert checked_train_parquet(out) == os.path.join(out, "train.parquet")
    table = pq.read_table(os.path.join(out, "train.parquet"))
    pq.write_table(table.slice(1), os.path.join(out, "train.parquet"))
    with pytest.raises(InputError, match="train.parquet.*differs from manifest.json.*re-run `eagle3 merge"):
        checked_train_parquet(os.path.join(out, "train.parquet"))
    with pytest.raises(InputError, match="differs from manifest.json"):
        vocab(VocabConfig(merged=out, out=str(tmp_path / "vocab"), draft_vocab_size=8))


def test_a_cut_prepared_parquet_is_refused_by_its_checksum_before_it_is_opened(tmp_path):
    rng = np.random.default_rng(3)
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(rng, 10)})
    path = os.path.join(prep, "a", "tokenized.parquet")
    stats = storage.read_json(os.path.join(prep, "a", "stats.json"))
    storage.write_json(os.path.join(prep, "a", "stats.json"), {**stats, "tokenized_sha256": storage.sha256_file(path)})
    with open(path, "r+b") as f:  # half the file: no Parquet footer left, so opening it would raise ArrowInvalid
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(InputError, match=r"a/tokenized.parquet: sha256 .* differs from stats.json"):
        merge(MergeConfig(prepared=prep, out=str(tmp_path / "m"), max_seq_len=32))
    from eagle3.stats import StatsConfig, compute_stats

    with pytest.raises(InputError, match=r"a/tokenized.parquet: sha256 .* differs from stats.json"):
        compute_stats(StatsConfig(prepared=prep, hidden_size=64), write=False)


def test_a_merge_that_keeps_nothing_fails_and_says_why(tmp_path):
    prep = write_prepared(tmp_path / "prep", {"a": [(list(range(20)), [0] * 15 + [1] * 5)] * 2})
    out = tmp_path / "m"
    with pytest.raises(InputError, match=r"merge kept 0 of 2 samples \(2 no_loss_tokens_after_truncation\); "
                                         r"raise --max-seq-len \(now 10\)"):
        merge(MergeConfig(prepared=prep, out=str(out), max_seq_len=10))
    assert not (out / "train.parquet").exists() and not (out / "manifest.json").exists()
