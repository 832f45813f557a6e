"""The tokenize stage end to end: outputs per CONTRACTS.md, rejects, cap, fingerprint skip, S3, CLI."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

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
    # one batch: a progress line with counts, and no ETA from a rate that was never measured (eagle3.progress)
    lines = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("tokenize arith: ")]
    assert any("elapsed" in ln and "ETA" not in ln for ln in lines) and any("done in" in ln for ln in lines)


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


@pytest.mark.parametrize("extra", ["merges.txt", "tokenizer.model", "additional_chat_templates/tool_use.jinja"])
def test_a_changed_tokenizer_file_redoes_the_tokenization(tmp_path, chatml_dir, extra):
    """Every file that tokenizes is in the fingerprint, not only tokenizer.json and the template: a re-run after
    a changed merges.txt, sentencepiece model or extra chat template tokenizes again."""
    tok = tmp_path / "tok"
    shutil.copytree(chatml_dir, tok)
    (tok / extra).parent.mkdir(parents=True, exist_ok=True)
    template = (tok / "chat_template.jinja").read_text()  # a valid one where the file is a chat template
    (tok / extra).write_text("{# first #}" + template)
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(3)])
    first = tokenize_dataset(config(tmp_path, src, str(tok)))
    (tok / "model.safetensors").write_text("weights do not tokenize")
    assert tokenize_dataset(config(tmp_path, src, str(tok)))["reused"] is True
    (tok / extra).write_text("{# second #}" + template)
    again = tokenize_dataset(config(tmp_path, src, str(tok)))
    assert again["reused"] is False and again["fingerprint"] != first["fingerprint"]


def test_the_tokenizer_fingerprint_by_hand(tmp_path):
    """sha256 over (relative name, sha256 of the content) in TOKENIZER_FILES' order, then the rest sorted: a
    folder with only the classic files keeps the fingerprint it had before the list grew."""
    from eagle3.target import tokenizer_fingerprint

    files = {"tokenizer_config.json": b"{}", "tokenizer.json": b'{"model": 1}', "merges.txt": b"a b",
             "additional_chat_templates/b.jinja": b"B", "additional_chat_templates/a.jinja": b"A"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    h = hashlib.sha256()
    for name in ["tokenizer.json", "tokenizer_config.json", "merges.txt", "additional_chat_templates/a.jinja",
                 "additional_chat_templates/b.jinja"]:
        h.update(name.encode() + hashlib.sha256(files[name]).hexdigest().encode())
    assert tokenizer_fingerprint(str(tmp_path)) == h.hexdigest()[:16]


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


# --- malformed input never costs more than its own line, and never a traceback (issue 15) -------------------------
def test_unreadable_files_are_input_errors_naming_the_file(tmp_path, chatml_dir):
    # the record count was taken before the guarded reader ran: EOFError / ArrowInvalid without the file's name
    import gzip

    data = gzip.compress(b"".join(json.dumps(conv(i)).encode() + b"\n" for i in range(500)))
    (tmp_path / "a.jsonl.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "b.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    for name in ("a.jsonl.gz", "b.parquet"):
        src = str(tmp_path / name)
        with pytest.raises(InputError) as e:
            tokenize_dataset(config(tmp_path, src, chatml_dir))
        assert e.value.file == src


def test_one_bad_string_costs_one_line_not_the_dataset(tmp_path, chatml_dir):
    # "\ud800" reached encode_batch, whose TypeError failed the whole dataset
    q, a = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
    bad = [
        {"messages": [{"role": "user", "content": "caf\ud800"}, a]},
        {"messages": [q, {"role": "assistant", "content": "a", "reasoning_content": "\udc00"}]},
        {"messages": [q, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": json.dumps({"city": "\ud800"})}}]}]},
        {"messages": [q, a], "tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]},
        {"messages": [{"role": ["user"], "content": "q"}, a]},  # was TypeError: unhashable type
        {"messages": "[" * 50_000 + "]" * 50_000},  # was RecursionError
    ]
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(10)] + bad)  # json.dumps escapes the surrogates
    summary = tokenize_dataset(config(tmp_path, src, chatml_dir, max_reject_share=0.5))
    assert (summary["samples"], summary["rejected"]) == (10, 6)
    rejects = [json.loads(x) for x in (tmp_path / "prep" / "arith" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (11, "lone UTF-16 surrogate"), (12, "lone UTF-16 surrogate"), (13, "lone UTF-16 surrogate"),
        (14, "lone UTF-16 surrogate"), (15, "unknown role"), (16, "nested too deeply")]


def _three_datasets(tmp_path) -> str:
    for name in ("a", "b", "c"):
        write_jsonl(tmp_path / f"{name}.jsonl", [conv(i) for i in range(3)])
    (tmp_path / "m.yaml").write_text("datasets:\n" + "".join(
        f"  - {{name: {n}, source: {n}.jsonl, format: messages}}\n" for n in "abc"))
    return str(tmp_path / "m.yaml")


def _failing(monkeypatch, errors: dict):
    """tokenize_dataset raising ``errors[name]`` for those datasets; returns the names it ran."""
    from eagle3.tokenize import stage

    real, ran = stage.tokenize_dataset, []

    def fake(cfg):
        ran.append(cfg.name)
        if cfg.name in errors:
            raise errors[cfg.name]
        return real(cfg)

    monkeypatch.setattr(stage, "tokenize_dataset", fake)
    return ran


def test_an_unexpected_error_does_not_skip_the_other_datasets(tmp_path, chatml_dir, monkeypatch):
    from eagle3.tokenize.stage import TokenizeFailed

    manifest = _three_datasets(tmp_path)
    bug = KeyError("boom")
    ran = _failing(monkeypatch, {"a": bug, "b": InputError("bad line", file="b.jsonl")})
    with pytest.raises(TokenizeFailed) as e:
        tokenize(TokenizeConfig(manifest=manifest, model=chatml_dir, out=str(tmp_path / "prep")))
    assert ran == ["a", "b", "c"] and os.path.exists(tmp_path / "prep" / "c" / "fingerprint.json")
    assert not isinstance(e.value, InputError) and e.value.__cause__ is bug  # a bug is not dressed up as bad input
    assert set(e.value.failures) == {"a", "b"}
    assert "2 of 3 dataset(s) failed" in str(e.value) and "a: KeyError: 'boom'" in str(e.value)
    assert "b: b.jsonl: bad line" in str(e.value)


def test_only_input_errors_give_one_input_error(tmp_path, chatml_dir, monkeypatch):
    ran = _failing(monkeypatch, {"b": InputError("bad line", file="b.jsonl")})
    with pytest.raises(InputError, match=r"1 of 3 dataset\(s\) failed:\n  b: b.jsonl: bad line"):
        tokenize(TokenizeConfig(manifest=_three_datasets(tmp_path), model=chatml_dir, out=str(tmp_path / "prep")))
    assert ran == ["a", "b", "c"]


def test_out_of_memory_is_raised_at_once_and_unchanged(tmp_path, chatml_dir, monkeypatch):
    from eagle3.errors import GpuOutOfMemory

    oom = MemoryError()
    ran = _failing(monkeypatch, {"b": oom})
    with pytest.raises(MemoryError) as e:
        tokenize(TokenizeConfig(manifest=_three_datasets(tmp_path), model=chatml_dir, out=str(tmp_path / "prep")))
    assert e.value is oom and ran == ["a", "b"]
    _failing(monkeypatch, {"a": GpuOutOfMemory("oom")})
    with pytest.raises(GpuOutOfMemory):
        tokenize(TokenizeConfig(manifest=_three_datasets(tmp_path), model=chatml_dir, out=str(tmp_path / "prep")))


def test_a_damaged_tokenized_file_is_tokenized_again_not_reused(tmp_path, chatml_dir):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(5)])
    tokenize_dataset(config(tmp_path, src, chatml_dir))
    parquet = tmp_path / "prep" / "arith" / "tokenized.parquet"
    good = parquet.read_bytes()
    assert json.loads((tmp_path / "prep" / "arith" / "stats.json").read_text())["tokenized_sha256"] == \
        hashlib.sha256(good).hexdigest()
    parquet.write_bytes(good[:-10])
    again = tokenize_dataset(config(tmp_path, src, chatml_dir))
    assert again["reused"] is False and parquet.read_bytes() == good


@pytest.mark.parametrize("name", ["fingerprint.json", "stats.json"])
def test_a_damaged_cache_marker_means_tokenize_again(tmp_path, chatml_dir, name, caplog):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(5)])
    first = tokenize_dataset(config(tmp_path, src, chatml_dir))
    marker = tmp_path / "prep" / "arith" / name
    marker.write_text(marker.read_text()[:25])  # a cut write
    with caplog.at_level(logging.WARNING):
        again = tokenize_dataset(config(tmp_path, src, chatml_dir))
    assert again["reused"] is False and again["samples"] == first["samples"]
    assert any(f"arith/{name}: not valid JSON" in r.getMessage() for r in caplog.records)
    assert tokenize_dataset(config(tmp_path, src, chatml_dir))["reused"] is True  # and the marker is whole again


def test_a_model_folder_without_a_tokenizer_is_named(tmp_path, chatml_dir):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(2)])
    bare = tmp_path / "model"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 100}))
    with pytest.raises(InputError, match=r"model: no tokenizer here \(none of tokenizer.json.*pass the target's"):
        tokenize_dataset(config(tmp_path, src, str(bare)))


def test_rejects_under_the_threshold_are_a_warning_naming_the_file(tmp_path, chatml_dir, caplog):
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(40)], extra_lines=["{not json"])
    with caplog.at_level(logging.WARNING):
        out = tokenize_dataset(config(tmp_path, src, chatml_dir))
    assert out["rejected"] == 1
    assert any("1 record(s) refused (malformed JSON: 1)" in r.getMessage() and "arith/rejects.jsonl" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_a_dataset_whose_every_record_is_refused_points_at_the_format(tmp_path, chatml_dir):
    sharegpt = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}] * 3
    src = write_jsonl(tmp_path / "a.jsonl", sharegpt)
    with pytest.raises(InputError, match=r"no record was accepted: check that the manifest's format \('messages'\) "
                                         r".*line 1: .*it has 'conversations': is the manifest's format sharegpt\?"):
        tokenize_dataset(config(tmp_path, src, chatml_dir))


def test_an_s3_target_is_tokenized_without_fetching_its_weights(tmp_path, chatml_dir, s3_bucket, monkeypatch):
    """tokenize runs on CPU workers: of an s3 model prefix it fetches the tokenizer files and config.json only,
    and tokenizes as from the local folder."""
    from pathlib import Path

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    prefix = f"{s3_bucket}/models/chatml"
    for f in Path(chatml_dir).iterdir():
        if f.is_file():
            storage.put_file(f, f"{prefix}/{f.name}")
    storage.write_bytes(f"{prefix}/model.safetensors", b"weights that tokenize must not fetch")
    src = write_jsonl(tmp_path / "a.jsonl", [conv(i) for i in range(4)])
    from_s3 = tokenize_dataset(config(tmp_path / "s3", src, prefix))
    local = tokenize_dataset(config(tmp_path / "local", src, chatml_dir))
    assert from_s3["samples"] == local["samples"] == 4 and from_s3["fingerprint"] == local["fingerprint"]
    fetched = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert "config.json" in " ".join(fetched) and not any("model.safetensors" in n for n in fetched), fetched


def test_tasks_mirroring_one_prefix_at_once_all_get_it_whole(tmp_path, s3_bucket, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    prefix = f"{s3_bucket}/models/m"
    files = {f"f{i}.bin": bytes([i]) * 200_000 for i in range(6)}
    for name, data in files.items():
        storage.write_bytes(f"{prefix}/{name}", data)
    with ThreadPoolExecutor(8) as pool:
        roots = list(pool.map(lambda _: storage.local_dir(prefix), range(8)))
    assert len(set(roots)) == 1
    from pathlib import Path

    assert {p.name: p.read_bytes() for p in Path(roots[0]).iterdir()} == files
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith((".tmp", ".part"))]
