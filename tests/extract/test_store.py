"""The hidden-state store: writer, reader, storage options, checksums, S3."""

from __future__ import annotations

import json
import os

import pytest
import torch

from eagle3.errors import InputError
from eagle3.extract.codec import encode
from eagle3.storage_options import bytes_per_token
from eagle3.extract.store import HiddenStateStore, StoreWriter, store_key, target_logprobs

H, V = 16, 50


def _samples(storage, lengths, seed=0, lm_head=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        aux = torch.randn(n, 3 * H, generator=g) * (1 + torch.arange(3).repeat_interleave(H))  # layer scales differ
        last = torch.randn(n, H, generator=g)
        out.append({
            "id": f"s{seed}-{i}", "input_ids": torch.randint(0, V, (n,), generator=g),
            "loss_mask": (torch.rand(n, generator=g) > 0.5).to(torch.uint8),
            "tensors": encode(storage, aux, last, lm_head=lm_head), "_aux": aux, "_last": last,
        })
    return out


def _writer(root, storage_option="bf16", task="0of1", **kw):
    args = dict(model_fp="fp0123", model_name="tiny", aux_layers=[1, 3, 4], hidden_size=H, vocab_size=V,
                storage_option=storage_option, task=task)
    args.update(kw)
    return StoreWriter(str(root), **args).open()


def test_bf16_roundtrip_offsets_and_index(tmp_path):
    w = _writer(tmp_path)
    a, b = _samples("bf16", [3, 5]), _samples("bf16", [4], seed=1)
    w.write_shard(a)
    w.write_shard(b)
    store = HiddenStateStore(str(tmp_path))  # root with exactly one key folder
    assert store.uri.endswith(store_key("fp0123", [1, 3, 4], "bf16"))
    assert store.sample_ids() == ["s0-0", "s0-1", "s1-0"]
    assert [store.num_tokens(s) for s in store.sample_ids()] == [3, 5, 4]
    got = store.get("s0-1")
    assert torch.equal(got["aux"], a[1]["_aux"].to(torch.bfloat16))
    assert torch.equal(got["last"], a[1]["_last"].to(torch.bfloat16))
    assert torch.equal(got["input_ids"], a[1]["input_ids"].to(torch.int32))
    assert torch.equal(got["loss_mask"], a[1]["loss_mask"])
    assert store.verify() == []
    assert w.done_ids() == {"s0-0", "s0-1", "s1-0"}
    assert sorted(os.listdir(store.uri)) == [
        "index-0of1.json", "shard-0of1-00000.safetensors", "shard-0of1-00001.safetensors", "store.json"]


def test_shards_are_standard_safetensors_with_deterministic_bytes(tmp_path):
    from safetensors import safe_open

    for run in ("a", "b"):
        _writer(tmp_path / run, storage_option="fp8").write_shard(_samples("fp8", [3, 2]))
    key = store_key("fp0123", [1, 3, 4], "fp8")
    files = [tmp_path / r / key / "shard-0of1-00000.safetensors" for r in ("a", "b")]
    assert files[0].read_bytes() == files[1].read_bytes()
    with safe_open(str(files[0]), framework="pt") as f:
        assert f.metadata()["storage_option"] == "fp8"
        assert f.get_tensor("offsets").tolist() == [0, 3, 5]
        assert f.get_tensor("aux").dtype == torch.float8_e4m3fn


def test_verify_reports_a_corrupted_shard(tmp_path):
    w = _writer(tmp_path)
    w.write_shard(_samples("bf16", [3]))
    shard = os.path.join(w.uri, "shard-0of1-00000.safetensors")
    data = bytearray(open(shard, "rb").read())
    data[-1] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    problems = HiddenStateStore(w.uri).verify()
    assert len(problems) == 1 and "sha256" in problems[0]


def test_another_tasks_bad_shard_is_dropped_from_its_index_only_when_verifiably_bad(tmp_path, monkeypatch):
    """Tasks of one store run at once: a task drops another task's shard only when it holds one of its samples
    and is still bad when checked again just before the index is rewritten (not mid-repair by its owner)."""
    from eagle3.extract import store as store_module

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    other = _writer(tmp_path, task="1of2")
    other.write_shard(_samples("bf16", [3, 4]))  # s0-0, s0-1
    other.write_shard(_samples("bf16", [5], seed=1))  # s1-0
    me = _writer(tmp_path, task="0of1")
    shard, index = (os.path.join(me.uri, n) for n in ("shard-1of2-00000.safetensors", "index-1of2.json"))
    good = open(shard, "rb").read()
    open(shard, "wb").write(good[:-1] + bytes([good[-1] ^ 0xFF]))
    before = open(index).read()
    assert me.drop_bad_shards_of_others(["s1-0"]) == {}  # holds none of this task's samples
    real = store_module.corrupted_shards

    def repaired_meanwhile(*args, **kw):  # its owner's in-place repair lands between the two checks
        bad = real(*args, **kw)
        open(shard, "wb").write(good)
        return bad

    monkeypatch.setattr(store_module, "corrupted_shards", repaired_meanwhile)
    assert me.drop_bad_shards_of_others(["s0-0"]) == {}
    assert open(index).read() == before and me.done_ids() == {"s0-0", "s0-1", "s1-0"}
    monkeypatch.setattr(store_module, "corrupted_shards", real)
    open(shard, "wb").write(good[:-1] + bytes([good[-1] ^ 0xFF]))
    dropped = me.drop_bad_shards_of_others(["s0-0", "s9"])
    assert list(dropped) == ["shard-1of2-00000.safetensors"] and "sha256" in dropped[shard.rsplit("/", 1)[1]]
    assert list(json.load(open(index))) == ["shard-1of2-00001.safetensors"] and me.done_ids() == {"s1-0"}
    _writer(tmp_path, task="1of2").write_shard(_samples("bf16", [2], seed=2))  # its owner's next run
    os.remove(os.path.join(me.uri, "shard-1of2-00002.safetensors"))  # a missing file is as bad
    assert list(me.drop_bad_shards_of_others(["s2-0"])) == ["shard-1of2-00002.safetensors"]
    assert HiddenStateStore(me.uri).verify() == []


@pytest.mark.parametrize("storage", ["bf16", "fp8", "fp8-topk"])
def test_bytes_per_token_matches_files(tmp_path, storage):
    head = torch.nn.Linear(H, V, bias=False)
    w = _writer(tmp_path, storage_option=storage)
    entry = w.write_shard(_samples(storage, [200, 300], lm_head=head))
    raw = HiddenStateStore(w.uri).get_raw("s0-0")
    per_token = sum(t[0].numel() * t.element_size() for t in raw.values())
    assert per_token == bytes_per_token(storage, H)
    size = os.path.getsize(os.path.join(w.uri, "shard-0of1-00000.safetensors"))
    assert bytes_per_token(storage, H) * entry["tokens"] < size < bytes_per_token(storage, H) * entry["tokens"] + 1024


def test_compact_option_sizes():
    h = 7168
    assert bytes_per_token("bf16", h) == 8 * h + 5
    assert bytes_per_token("fp8", h) - 5 <= 4 * h + 8
    assert bytes_per_token("fp8-topk", h) - 5 <= 4 * h + 8


def test_fp8_decode_error_is_small_relative_to_each_layer(tmp_path):
    w = _writer(tmp_path, storage_option="fp8")
    samples = _samples("fp8", [64])
    w.write_shard(samples)
    got = HiddenStateStore(w.uri).get("s0-0")
    for k in range(3):  # each aux layer has its own scale; errors stay relative to it
        ref = samples[0]["_aux"][:, k * H:(k + 1) * H]
        err = (got["aux"][:, k * H:(k + 1) * H] - ref).abs().max() / ref.abs().max()
        assert err < 0.07  # e4m3: 3 mantissa bits -> <= 1/16 relative step
    assert ((got["last"] - samples[0]["_last"]).abs().max() / samples[0]["_last"].abs().max()) < 0.07


def test_target_logprobs_same_interface_for_last_and_topk(tmp_path):
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False)
    for storage in ("bf16", "fp8-topk"):
        w = _writer(tmp_path / storage, storage_option=storage)
        samples = _samples(storage, [20], lm_head=head)
        w.write_shard(samples)
        got = HiddenStateStore(w.uri).get("s0-0")
        logp = target_logprobs(got, head.weight.detach())
        ref = torch.log_softmax(head(samples[0]["_last"]).detach(), -1)
        assert logp.shape == (20, V)
        assert torch.equal(logp.argmax(-1), ref.argmax(-1))
        assert torch.allclose(logp.exp().sum(-1), torch.ones(20), atol=1e-4)
        if storage == "fp8-topk":
            assert "last" not in got and got["topk_ids"].shape == (20, 16)
            assert int(torch.isfinite(logp).sum(-1).max()) == 16
            top = ref.topk(16, -1)
            assert torch.equal(got["topk_ids"].long(), top.indices)
        else:
            assert torch.allclose(logp, ref, atol=0.05)


def test_store_json_mismatch_is_refused(tmp_path):
    _writer(tmp_path)
    with pytest.raises(InputError, match="another store"):
        _writer(tmp_path, vocab_size=V + 1)


def test_a_runtime_quantization_other_than_the_stores_is_refused(tmp_path):
    """--quantization changes the target but not the store key: a store holds the states of one."""
    fp8 = {"name": "vllm", "version": "0.32.0", "quantization": "fp8"}
    _writer(tmp_path, engine=fp8).write_shard(_samples("bf16", [3]))
    for engine, had, wanted in [({**fp8, "quantization": None}, "'fp8'", "None"),
                                ({"name": "transformers", "version": "5.24.0"}, "'fp8'", "None"),
                                ({**fp8, "quantization": "awq"}, "'fp8'", "'awq'")]:
        with pytest.raises(InputError, match=f"store.json: this store was filled by the target served with "
                                             f"quantization {had}, this task's engine serves it with {wanted}.*"
                                             "extract with --quantization fp8, as the store was, or into another "
                                             "store"):
            _writer(tmp_path, task="1of2", engine=engine)
    _writer(tmp_path, task="1of2", engine={**fp8, "tensor_parallel_size": 8})  # the same target
    plain = {"name": "vllm", "version": "0.32.0", "quantization": None}
    path = os.path.join(_writer(tmp_path / "b", engine={"name": "transformers", "version": "5.24.0"}).uri,
                        "store.json")
    _writer(tmp_path / "b", task="1of2", engine=plain)  # the transformers engine never quantizes
    info = json.load(open(path))
    del info["engine"]  # as written before engines were recorded (the transformers engine alone)
    open(path, "w").write(json.dumps(info))
    _writer(tmp_path / "b", task="1of2", engine=plain)
    with pytest.raises(InputError, match="extract with no --quantization, as the store was"):
        _writer(tmp_path / "b", task="1of2", engine=fp8)


def test_root_with_two_stores_asks_for_one(tmp_path):
    _writer(tmp_path, storage_option="bf16").write_shard(_samples("bf16", [2]))
    _writer(tmp_path, storage_option="fp8").write_shard(_samples("fp8", [2]))
    with pytest.raises(InputError, match="several stores"):
        HiddenStateStore(str(tmp_path))
    with pytest.raises(InputError, match="no hidden-state store"):
        HiddenStateStore(str(tmp_path / "nothing"))


def test_s3_store_roundtrip(s3_bucket):
    root = f"{s3_bucket}/store"
    w = _writer(root, storage_option="fp8")
    samples = _samples("fp8", [5, 7])
    w.write_shard(samples)
    store = HiddenStateStore(root)
    assert store.sample_ids() == ["s0-0", "s0-1"]
    assert store.verify() == []
    assert torch.equal(store.get_raw("s0-1")["aux"].view(torch.uint8),
                       samples[1]["tensors"]["aux"].view(torch.uint8))


def test_truncated_shard_is_an_input_error_naming_it_and_check_uses_marks(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    w = _writer(tmp_path / "s")
    w.write_shard(_samples("bf16", [3, 4]))
    w.write_shard(_samples("bf16", [5], seed=1))
    store = HiddenStateStore(w.uri)
    store.check()  # hashes both, records the marks
    marks = list((tmp_path / "cache" / "verified").glob("*.json"))
    assert len(marks) == 1 and len(json.loads(marks[0].read_text())) == 2
    shard = os.path.join(w.uri, "shard-0of1-00000.safetensors")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(InputError, match="shard-0of1-00000.safetensors.*re-run `eagle3 extract`"):
        HiddenStateStore(w.uri).get("s0-0")
    with pytest.raises(InputError, match="1 corrupted hidden-state shard.*shard-0of1-00000"):
        HiddenStateStore(w.uri).check(["s0-1"])  # the size changed: the mark no longer holds
    HiddenStateStore(w.uri).check(["s1-0"])  # only the shards a stage reads are checked


def test_a_store_json_written_before_the_rename_opens_and_is_rewritten_by_the_next_writer(tmp_path, caplog):
    """store.json of an older release spells the identity ``layers`` and ``storage``. Readers take it (with a
    deprecation message), the folder name is unchanged (existing stores are reused), and the next writer of the
    store rewrites the file under the new keys."""
    import logging

    w = _writer(tmp_path, storage_option="fp8")
    w.write_shard(_samples("fp8", [3, 2]))
    assert os.path.basename(w.uri) == "fp0123-L1_3_4-fp8"
    path = os.path.join(w.uri, "store.json")
    new = json.load(open(path))
    assert (new["aux_layers"], new["storage_option"]) == ([1, 3, 4], "fp8") and "layers" not in new
    old = {("layers" if k == "aux_layers" else "storage" if k == "storage_option" else k): v for k, v in new.items()}
    open(path, "w").write(json.dumps(old))
    said = (f"{path}: {{}} is deprecated, use {{}} (re-run `eagle3 extract` on this store, which rewrites the file, "
            "or rename the key there); the old name is read for one more release")
    with caplog.at_level(logging.WARNING), pytest.warns(DeprecationWarning) as recorded:
        store = HiddenStateStore(str(tmp_path), store_key("fp0123", [1, 3, 4], "fp8"))
    assert [str(r.message) for r in recorded] == [said.format("layers", "aux_layers"),
                                                  said.format("storage", "storage_option")]
    assert said.format("layers", "aux_layers") in caplog.text
    assert (store.aux_layers, store.storage_option, store.info) == ([1, 3, 4], "fp8", new)
    assert store.get("s0-1")["aux"].shape == (2, 3 * H)
    with pytest.warns(DeprecationWarning):
        again = _writer(tmp_path, storage_option="fp8")  # the same store: no "describes another store"
    assert again.uri == w.uri and json.load(open(path)) == new
    again.write_shard(_samples("fp8", [4], seed=1))
    assert len(HiddenStateStore(w.uri)) == 3


def test_a_long_check_says_how_far_it_is(tmp_path, monkeypatch, caplog):
    """Hashing a store's shards (a terabyte: minutes) logs the shards checked and an ETA as it goes."""
    import logging

    from eagle3.extract import store as store_module

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store_module, "PROGRESS_EVERY_S", 0.0, raising=False)  # a line after every shard
    w = _writer(tmp_path / "s")
    entries = [w.write_shard(_samples("bf16", [3], seed=seed)) for seed in range(4)]
    with caplog.at_level(logging.INFO, logger="eagle3.extract.store"):
        HiddenStateStore(w.uri).check()
    lines = [r.getMessage() for r in caplog.records if "shards checked, elapsed" in r.getMessage()]
    assert lines and lines[0].startswith(f"{w.uri}: 1/4 shards checked, elapsed ") and ", ETA " in lines[0]
    for seq, entry in enumerate(entries):  # each entry records its shard's size (S3 checks that instead)
        assert entry["bytes"] == os.path.getsize(os.path.join(w.uri, f"shard-0of1-{seq:05d}.safetensors"))
