"""The extract stage in-process on the tiny model: content, incremental runs, task split, estimate."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from eagle3.errors import InputError
from eagle3.extract.capture import TargetCapture
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore, target_logprobs

from extract_testdata import make_samples, write_merged

pytestmark = pytest.mark.precision  # the numbers follow the precision policy (make test forces both)


def _cfg(merged, model, out, **kw):
    return ExtractConfig(merged=merged, model=model, out=str(out),
                         **{"device": "cpu", "token_budget": 256, "shard_mb": 1, "progress_every_s": 0, **kw})


def test_store_holds_exact_real_tokens_matching_single_sample_forward(tmp_path, tiny_llama_dir, caplog):
    samples = make_samples(20, seed=2)
    merged = write_merged(tmp_path / "m", samples)
    with caplog.at_level(logging.INFO):
        summary = extract(_cfg(merged, tiny_llama_dir, tmp_path / "store"))
    assert summary["samples_extracted"] == 20 and summary["samples_skipped"] == 0
    assert summary["tokens"] == sum(len(s["input_ids"]) for s in samples)  # padding never stored
    assert 0 <= summary["padding_share"] < 0.5
    assert "extract estimate:" in caplog.text and "tok/s" in caplog.text and "ETA" in caplog.text
    store = HiddenStateStore(str(tmp_path / "store"))
    assert sorted(store.sample_ids()) == sorted(s["id"] for s in samples)
    assert store.aux_layers == [1, 3, 4] and store.verify() == []
    cap = TargetCapture(tiny_llama_dir, "cpu")
    for s in samples[:4]:
        got = store.get(s["id"])
        assert got["input_ids"].tolist() == s["input_ids"] and got["loss_mask"].tolist() == s["loss_mask"]
        aux, last, _ = cap.forward([s["input_ids"]])
        assert torch.allclose(got["aux"].float(), aux, rtol=2e-2, atol=2e-2)
        assert torch.allclose(got["last"].float(), last, rtol=2e-2, atol=2e-2)


def test_incremental_run_extracts_only_the_new_dataset(tmp_path, tiny_llama_dir):
    first, added = make_samples(12, seed=3), make_samples(7, seed=4)
    out = tmp_path / "store"
    extract(_cfg(write_merged(tmp_path / "m1", first), tiny_llama_dir, out))
    summary = extract(_cfg(write_merged(tmp_path / "m2", first + added), tiny_llama_dir, out))
    assert summary["samples_extracted"] == 7 and summary["samples_skipped"] == 12
    assert summary["tokens"] == sum(len(s["input_ids"]) for s in added)
    assert len(HiddenStateStore(str(out))) == 19
    again = extract(_cfg(write_merged(tmp_path / "m2", first + added), tiny_llama_dir, out))
    assert again["samples_extracted"] == 0 and again["shards_written"] == 0


def test_tasks_split_the_work_and_write_their_own_files(tmp_path, tiny_llama_dir):
    samples = make_samples(16, seed=5)
    merged, out = write_merged(tmp_path / "m", samples), tmp_path / "store"
    parts = [extract(_cfg(merged, tiny_llama_dir, out, shard=f"{i}/2")) for i in range(2)]
    assert sum(p["samples_extracted"] for p in parts) == 16 and all(p["samples_extracted"] for p in parts)
    store = HiddenStateStore(str(out))
    names = sorted(n.name for n in (out / store.uri.rsplit("/", 1)[1]).iterdir())
    assert "index-0of2.json" in names and "index-1of2.json" in names
    assert {s.split("-")[1] for s in store.shards} == {"0of2", "1of2"}
    assert sorted(store.sample_ids()) == sorted(s["id"] for s in samples)
    # a single task afterwards finds everything stored
    assert extract(_cfg(merged, tiny_llama_dir, out))["samples_extracted"] == 0


@pytest.mark.parametrize("damage", ["flipped", "deleted"])
def test_another_tasks_bad_shard_is_dropped_and_its_samples_extracted_again(tmp_path, tiny_llama_dir, monkeypatch,
                                                                             damage):
    """A store filled by tasks 0/2 and 1/2, then a 1of2 shard rots or goes. Train's error says to re-run
    extract; a run with another split (here none) must repair it, although the shard is not in its own index
    and its samples are listed as done: it drops the shard from index-1of2.json and extracts those samples, so
    the store then verifies and holds every sample once. A sibling (0/2) holds none of them and leaves it."""
    from pathlib import Path

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))  # this test's verified marks only
    samples = make_samples(16, seed=5)
    merged, out = write_merged(tmp_path / "m", samples), tmp_path / "store"
    for i in range(2):
        extract(_cfg(merged, tiny_llama_dir, out, shard=f"{i}/2", shard_mb=0.03))
    store = HiddenStateStore(str(out))
    index = Path(store.uri) / "index-1of2.json"
    names = sorted(n for n in store.shards if "-1of2-" in n)
    assert len(names) > 1
    shard, ids = Path(store.uri) / names[0], store.shards[names[0]]["sample_ids"]
    if damage == "flipped":
        data = bytearray(shard.read_bytes())
        data[-5] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        shard.unlink()
    with pytest.raises(InputError, match=f"{shard.name}: .*re-run `eagle3 extract`"):
        store.check()
    before = index.read_bytes()
    assert extract(_cfg(merged, tiny_llama_dir, out, shard="0/2", shard_mb=0.03))["samples_extracted"] == 0
    assert index.read_bytes() == before  # none of 0/2's samples are in it: task 1/2's to repair
    summary = extract(_cfg(merged, tiny_llama_dir, out, shard_mb=0.03))
    store = HiddenStateStore(str(out))
    store.check()
    assert summary["shards_dropped"] == [shard.name] and summary["samples_extracted"] == len(ids)
    assert sorted(json.loads(index.read_text())) == names[1:]  # the other shards of 1of2 stay
    listed = [sid for e in store.shards.values() for sid in e["sample_ids"]]
    assert sorted(listed) == sorted(s["id"] for s in samples)  # every sample, once
    again = extract(_cfg(merged, tiny_llama_dir, out, shard_mb=0.03))
    assert (again["samples_extracted"], again["shards_dropped"]) == (0, [])


def test_layer_override_keys_the_store(tmp_path, tiny_llama_dir, merged_small):
    summary = extract(_cfg(merged_small, tiny_llama_dir, tmp_path / "s", aux_layers=(0, 2, 5)))
    assert summary["store"].endswith("-L0_2_5-bf16")
    assert HiddenStateStore(summary["store"]).aux_layers == [0, 2, 5]


def test_an_old_style_command_line_fills_the_store_the_new_one_reuses(tmp_path, tiny_llama_dir, merged_small,
                                                                      capsys, caplog):
    """`eagle3 extract --storage fp8 --layers 0,2,5` (the flags' names before the rename) still runs, says which
    flags replace them, and fills the same store folder that the new flags then find complete."""
    from eagle3.cli import main

    common = ["extract", "--merged", merged_small, "--model", tiny_llama_dir, "--out", str(tmp_path / "s"),
              "--device", "cpu", "--token-budget", "256"]
    with pytest.warns(DeprecationWarning):
        assert main([*common, "--storage", "fp8", "--layers", "0,2,5"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert "command line: --storage is deprecated, use --storage-option" in caplog.text
    assert "command line: --layers is deprecated, use --aux-layers" in caplog.text
    assert old["store"].endswith("-L0_2_5-fp8") and old["samples_extracted"] == 24
    assert (old["storage_option"], old["aux_layers"]) == ("fp8", [0, 2, 5])
    assert main([*common, "--storage-option", "fp8", "--aux-layers", "0,2,5"]) == 0
    new = json.loads(capsys.readouterr().out)
    assert (new["store"], new["samples_skipped"], new["samples_extracted"]) == (old["store"], 24, 0)


def test_fp8_topk_store_rebuilds_the_target_argmax(tmp_path, tiny_llama_dir):
    samples = make_samples(6, seed=6)
    summary = extract(_cfg(write_merged(tmp_path / "m", samples), tiny_llama_dir, tmp_path / "s",
                           storage_option="fp8-topk"))
    assert summary["bytes_per_token"] == 3 * 64 + 6 + 16 * 6 + 5
    store = HiddenStateStore(summary["store"])
    cap = TargetCapture(tiny_llama_dir, "cpu")
    s = samples[0]
    got = store.get(s["id"])
    assert "last" not in got
    with torch.no_grad():
        logits = cap.model(input_ids=torch.tensor([s["input_ids"]])).logits[0]
    logp = target_logprobs(got, cap.model.lm_head.weight)
    assert torch.equal(logp.argmax(-1), logits.argmax(-1))


def test_estimate_refuses_a_store_that_cannot_fit(tmp_path, tiny_llama_dir, merged_small, monkeypatch):
    from eagle3 import storage

    monkeypatch.setattr(storage, "free_bytes", lambda uri: 1000)
    with pytest.raises(InputError, match="GB free"):
        extract(_cfg(merged_small, tiny_llama_dir, tmp_path / "s", tokens_per_s=1000.0))


def test_s3_store(s3_bucket, tmp_path, tiny_llama_dir, merged_small):
    summary = extract(_cfg(merged_small, tiny_llama_dir, f"{s3_bucket}/store", storage_option="fp8"))
    assert summary["store"].startswith("s3://")
    store = HiddenStateStore(f"{s3_bucket}/store")
    assert len(store) == 24 and store.verify() == []


def test_bad_config_is_refused(tmp_path):
    with pytest.raises(InputError, match="storage"):
        ExtractConfig(merged="m", model="x", out="o", storage_option="int4")
    with pytest.raises(InputError, match="--shard"):
        ExtractConfig(merged="m", model="x", out="o", shard="2/2")
    from eagle3.config import from_dict

    with pytest.raises(InputError, match="unknown key"):
        from_dict(ExtractConfig, {"merged": "m", "model": "x", "out": "o", "batch": 3})
    with pytest.raises(InputError, match="token_budget"):
        from_dict(ExtractConfig, {"merged": "m", "model": "x", "out": "o", "token_budget": "8192"})


def test_bad_merged_input_names_the_row_and_the_fix(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3.extract.stage import read_merged

    with pytest.raises(InputError, match="run `eagle3 merge"):
        read_merged(str(tmp_path / "missing"))
    (tmp_path / "m").mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "input_ids": [[1, 2], [3, 4, 5]], "loss_mask": [[0, 1], [1, 1]]}),
                   tmp_path / "m" / "train.parquet")
    with pytest.raises(InputError, match=r"row 1 \(id b\): 3 input_ids vs 2 loss_mask"):
        read_merged(str(tmp_path / "m"))


def test_read_merged_keeps_tokens_in_flat_arrays(tmp_path):
    from eagle3.extract.stage import read_merged

    samples = make_samples(5, seed=9)
    merged, tokens = read_merged(write_merged(tmp_path / "m", samples + samples[:1]))  # one duplicate id
    assert [s.id for s in merged] == [s["id"] for s in samples]
    for s, ref in zip(merged, samples):
        ids, mask = tokens.row(s.row)
        assert s.num_tokens == len(ref["input_ids"]) and ids.tolist() == ref["input_ids"]
        assert mask.tolist() == ref["loss_mask"]
