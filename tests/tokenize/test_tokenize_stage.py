"""The tokenize stage end to end: outputs per CONTRACTS.md, rejects, cap, fingerprint skip, S3, CLI."""

from __future__ import annotations

import hashlib
import json
import logging
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from eagle3 import storage
from eagle3.cli import main
from eagle3.errors import InputError
from eagle3.tokenize import TokenizeConfig, tokenize
from eagle3.tokenize.stage import DatasetConfig, tokenize_dataset


def conv(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                         {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]}


def write_jsonl(path, records, extra_lines=()) -> str:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def config(tmp_path, source, tok, **kw) -> DatasetConfig:
    return DatasetConfig(name=kw.pop("name", "arith"), source=str(source), format=kw.pop("format", "messages"),
                          tokenizer=tok, out=str(tmp_path / "prep"), **kw)


def test_outputs_follow_the_contract(tmp_path, chatml_dir, caplog):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(20)], ["{broken", '{"messages": []}'])
    with caplog.at_level(logging.INFO):
        summary = tokenize_dataset(config(tmp_path, src, chatml_dir, max_reject_share=0.1, category="math",
                                          batch_size=8))
    out = tmp_path / "prep" / "arith"
    assert summary["samples"] == 20 and summary["rejected"] == 2 and summary["reused"] is False
    assert sorted(os.listdir(out)) == ["fingerprint.json", "rejects.jsonl", "stats.json", "tokenized.parquet"]
    table = pq.read_table(out / "tokenized.parquet")
    assert [str(t) for t in table.schema.types] == ["string", "list<element: int32>", "list<element: uint8>",
                                                    "int32", "int32", "string"]
    assert table.column_names == ["id", "input_ids", "loss_mask", "num_tokens", "num_loss_tokens", "source"]
    rows = table.to_pylist()
    assert [r["source"] for r in rows] == ["arith"] * 20
    for r in rows:
        ids, mask = np.array(r["input_ids"], "<i4"), np.array(r["loss_mask"], "u1")
        assert r["id"] == hashlib.sha256(ids.tobytes() + mask.tobytes()).hexdigest()[:32]
        assert r["num_tokens"] == len(ids) and r["num_loss_tokens"] == int(mask.sum()) > 0
    stats = json.loads((out / "stats.json").read_text())
    assert {k: stats[k] for k in ("dataset", "format", "category", "samples", "rejected", "reused")} == \
        {"dataset": "arith", "format": "messages", "category": "math", "samples": 20, "rejected": 2, "reused": False}
    assert stats["tokens"] == sum(r["num_tokens"] for r in rows)
    assert stats["loss_tokens"] == sum(r["num_loss_tokens"] for r in rows)
    assert stats["reject_reasons"] == {"malformed JSON": 1, "no messages": 1}
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["file"], r["line"], r["reason"]) for r in rejects] == [(src, 21, "malformed JSON"),
                                                                      (src, 22, "no messages")]
    assert any("ETA" in rec.getMessage() and "tok/s" in rec.getMessage() for rec in caplog.records)


def test_unchanged_fingerprint_is_skipped_and_changes_redo(tmp_path, chatml_dir):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(5)])
    first = tokenize_dataset(config(tmp_path, src, chatml_dir))
    parquet = tmp_path / "prep" / "arith" / "tokenized.parquet"
    mtime = parquet.stat().st_mtime_ns
    again = tokenize_dataset(config(tmp_path, src, chatml_dir))
    assert again["reused"] is True and again["fingerprint"] == first["fingerprint"]
    assert parquet.stat().st_mtime_ns == mtime
    assert json.loads((tmp_path / "prep" / "arith" / "stats.json").read_text())["reused"] is True
    capped = tokenize_dataset(config(tmp_path, src, chatml_dir, max_samples=3))  # settings changed
    assert capped["reused"] is False and capped["fingerprint"] != first["fingerprint"]
    write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(6)])  # input changed
    changed = tokenize_dataset(config(tmp_path, src, chatml_dir))
    assert changed["reused"] is False and changed["samples"] == 6


def test_max_samples_cap_is_applied_and_counted(tmp_path, chatml_dir):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(10)])
    summary = tokenize_dataset(config(tmp_path, src, chatml_dir, max_samples=4))
    stats = json.loads((tmp_path / "prep" / "arith" / "stats.json").read_text())
    assert summary["samples"] == 4 and stats["over_cap"] == 6 and stats["max_samples"] == 4


def test_reject_share_above_threshold_fails_with_reasons(tmp_path, chatml_dir):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(8)],
                      ["{x", "{y", '{"messages": [{"role": "alien", "content": "x"}]}'])
    with pytest.raises(InputError) as e:
        tokenize_dataset(config(tmp_path, src, chatml_dir))
    msg = str(e.value)
    assert "3 of 11 records refused (27.3%)" in msg and "max_reject_share 5.0%" in msg
    assert "malformed JSON: 2" in msg and "unknown role: 1" in msg
    out = tmp_path / "prep" / "arith"
    assert len((out / "rejects.jsonl").read_text().splitlines()) == 3
    assert not (out / "tokenized.parquet").exists() and not (out / "fingerprint.json").exists()
    assert tokenize_dataset(config(tmp_path, src, chatml_dir, max_reject_share=0.3))["samples"] == 8
    with pytest.raises(InputError, match="27.3% of records were refused"):  # reused, but the threshold still holds
        tokenize_dataset(config(tmp_path, src, chatml_dir, max_reject_share=0.2))


def test_tokenized_format_passes_through(tmp_path, chatml_dir):
    recs = [{"input_ids": [1, 5, 7, 2], "loss_mask": [0, 0, 1, 1]}, {"input_ids": [3, 4], "loss_mask": [1, 1]}]
    src = write_jsonl(tmp_path / "t.jsonl", recs, [json.dumps({"input_ids": [49152], "loss_mask": [1]})])
    summary = tokenize_dataset(config(tmp_path, src, chatml_dir, name="seed", format="tokenized",
                                      max_reject_share=0.5))
    rows = pq.read_table(tmp_path / "prep" / "seed" / "tokenized.parquet").to_pylist()
    assert [(r["input_ids"], r["loss_mask"]) for r in rows] == [(r["input_ids"], r["loss_mask"]) for r in recs]
    assert summary["rejected"] == 1  # id 49152 >= vocab size 49152


def test_missing_source_is_an_input_error(tmp_path, chatml_dir):
    with pytest.raises(InputError, match="does not exist"):
        tokenize_dataset(config(tmp_path, tmp_path / "nope.jsonl", chatml_dir))


def test_s3_source_and_output(tmp_path, chatml_dir, s3_bucket):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(4)])
    storage.put_file(src, f"{s3_bucket}/in/a.jsonl")
    cfg = DatasetConfig(name="arith", source=f"{s3_bucket}/in/a.jsonl", format="messages", tokenizer=chatml_dir,
                         out=f"{s3_bucket}/prep")
    assert tokenize_dataset(cfg)["samples"] == 4
    assert storage.list_files(f"{s3_bucket}/prep/arith") == ["fingerprint.json", "rejects.jsonl", "stats.json",
                                                            "tokenized.parquet"]
    assert tokenize_dataset(cfg)["reused"] is True


def test_manifest_and_cli(tmp_path, chatml_dir, capsys):
    write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(3)])
    write_jsonl(tmp_path / "b.jsonl", [conv(i) for i in range(2)])
    (tmp_path / "m.yaml").write_text("datasets:\n  - {name: a, source: a.jsonl, format: messages}\n"
                                     "  - {name: b, source: b.jsonl, format: messages}\n")
    prep = str(tmp_path / "prep")
    assert main(["tokenize", "--manifest", str(tmp_path / "m.yaml"), "--tokenizer", chatml_dir, "--out", prep,
                 "--dataset", "b"]) == 0
    assert json.loads(capsys.readouterr().out)["datasets"]["b"]["samples"] == 2
    assert sorted(os.listdir(prep)) == ["b"]
    results = tokenize(TokenizeConfig(manifest=str(tmp_path / "m.yaml"), model=chatml_dir, out=prep))["datasets"]
    assert (results["a"]["reused"], results["b"]["reused"]) == (False, True)
    assert main(["tokenize", "--manifest", str(tmp_path / "m.yaml"), "--tokenizer", chatml_dir, "--out", prep,
                 "--dataset", "zzz"]) == 2
    assert "dataset 'zzz' is not in" in capsys.readouterr().err


def test_manifest_dataset_with_regenerated_source(tmp_path, chatml_dir):
    write_jsonl(tmp_path / "orig.jsonl", [{"input_ids": [1, 2], "loss_mask": [0, 1]}])
    regenerated = write_jsonl(tmp_path / "regen.jsonl", [conv(i) for i in range(3)])
    (tmp_path / "m.yaml").write_text("datasets:\n  - {name: a, source: orig.jsonl, format: tokenized, "
                                     "regenerate: true, max_samples: 2}\n")
    summary = tokenize(TokenizeConfig(manifest=str(tmp_path / "m.yaml"), dataset="a", model=chatml_dir,
                                      out=str(tmp_path / "prep"), source_override=regenerated,
                                      max_reject_share=0.0))["datasets"]["a"]
    stats = json.loads((tmp_path / "prep" / "a" / "stats.json").read_text())
    assert (summary["samples"], stats["format"], stats["source_uri"], stats["over_cap"]) == \
        (2, "messages", regenerated, 1)
    with pytest.raises(InputError, match="'b' is not in"):
        tokenize(TokenizeConfig(manifest=str(tmp_path / "m.yaml"), dataset="b", model=chatml_dir,
                                out=str(tmp_path / "prep")))


def test_chunking_does_not_change_the_output(tmp_path, chatml_dir):
    from itertools import islice

    from eagle3.tokenize.chat_mask import ramp_chunk_sizes

    assert list(islice(ramp_chunk_sizes(1024), 6)) == [64, 128, 256, 512, 1024, 1024]
    assert list(islice(ramp_chunk_sizes(100), 3)) == [64, 100, 100]
    assert list(islice(ramp_chunk_sizes(3), 2)) == [3, 3]
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(300)])
    tables = []
    for bs in (3, 1024):
        out = tmp_path / f"bs{bs}"
        tokenize_dataset(DatasetConfig(name="arith", source=src, format="messages", tokenizer=chatml_dir,
                                        out=str(out), batch_size=bs))
        tables.append(pq.read_table(out / "arith" / "tokenized.parquet"))
    assert tables[0].num_rows == 300 and tables[0].equals(tables[1])
