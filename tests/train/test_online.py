"""Online training (eagle3.train.online) against offline training on a tiny real target.

The oracle is the offline pipeline itself: the real extract stage fills a store, the trainer
reads it. Online runs the same target inside training; on the same data, seed and steps the
loss curves must agree within float tolerance, for a `last` option and the top-k option.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from eagle3.checkpoint import read_metrics
from eagle3.errors import InputError
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore
from eagle3.train.config import TrainConfig
from eagle3.train.loop import train
from tests.extract.extract_testdata import write_merged
from tests.train.train_helpers import _sequences, build_store, peaked_copy

N = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_llama_dir) -> dict:
    root = tmp_path_factory.mktemp("online")
    target = peaked_copy(tiny_llama_dir, root / "target")
    seqs = _sequences(N, seed=3)
    _, vocab = build_store(root / "vocab-src", target, seqs=seqs)  # a vocab of the target's argmax tokens
    samples = []
    for ids in seqs:
        mask = [0, 0, 0] + [1] * (len(ids) - 3)
        samples.append({"id": hashlib.sha256(repr((ids, mask)).encode()).hexdigest()[:32], "input_ids": ids,
                        "loss_mask": mask})
    merged = write_merged(root / "merged", samples)
    return {"root": root, "target": target, "vocab": vocab, "merged": merged}


def cfg(data, out, store, **kw) -> TrainConfig:
    base = dict(store=None if store is None else str(store), vocab=data["vocab"], out=str(out), merged=data["merged"], model=data["target"],
                ttt_length=3, token_budget=128, lr=3e-3, log_every=1, eval_every=4, save_every=1, epochs=2,
                heldout_share=0.1, init="random", device="cpu", precision="float32")
    base.update(kw)
    return TrainConfig(**base)


def offline_store(data, storage_option: str, shard: str = "0/1", name: str | None = None) -> str:
    out = data["root"] / (name or f"store-{storage_option}")
    extract(ExtractConfig(merged=data["merged"], model=data["target"], out=str(out), storage_option=storage_option,
                          shard=shard, device="cpu", precision="float32", token_budget=256))
    return str(out)


def curve(out, event="train") -> list[float]:
    return [r["loss"] for r in read_metrics(str(out / "metrics.jsonl"), event)]


@pytest.mark.parametrize("storage_option", ["bf16", "fp8-topk"])
def test_online_gives_the_offline_loss_curve(data, tmp_path, storage_option):
    torch.set_num_threads(1)
    off = train(cfg(data, tmp_path / "off", offline_store(data, storage_option), storage_option=storage_option))
    on = train(cfg(data, tmp_path / "on", tmp_path / "no-store", storage_option=storage_option, online=True))
    assert off["mode"] == "offline" and on["mode"] == "online"
    assert on["steps"] == off["steps"] >= 6
    assert curve(tmp_path / "on") == pytest.approx(curve(tmp_path / "off"), rel=1e-5)
    assert curve(tmp_path / "on", "eval") == pytest.approx(curve(tmp_path / "off", "eval"), rel=1e-5)
    assert on["sim_accept_len"] == pytest.approx(off["sim_accept_len"], rel=1e-2)
    stats = on["online"]
    # every sample computed once per epoch (train) and once per evaluation (held-out), nothing read from a store
    assert stats["samples_from_store"] == 0 and stats["samples_computed"] > N
    assert stats["target_seconds"] > 0 and not (tmp_path / "no-store").exists()
    rows = read_metrics(str(tmp_path / "on" / "metrics.jsonl"), "train")
    assert all(r["mode"] == "online" and r["tokens_per_s"] > 0 for r in rows)


def test_hybrid_reads_what_is_stored_computes_the_rest_and_writes_it_back(data, tmp_path):
    torch.set_num_threads(1)
    full = offline_store(data, "bf16")
    off = tmp_path / "off"
    train(cfg(data, off, full))
    half = offline_store(data, "bf16", shard="0/2", name="store-half")
    stored_before = len(HiddenStateStore(half))
    assert 0 < stored_before < N
    on = train(cfg(data, tmp_path / "on", half, online=True, write_back=True))
    assert curve(tmp_path / "on") == pytest.approx(curve(off), rel=1e-5)
    stats = on["online"]
    # each missing sample computed exactly once: epoch 1 reads the written-back shard
    assert stats["samples_computed"] == N - stored_before == stats["samples_written_back"]
    assert stats["samples_from_store"] > stored_before
    after, ref = HiddenStateStore(half), HiddenStateStore(full)
    assert sorted(after.sample_ids()) == sorted(ref.sample_ids())
    for sid in ref.sample_ids():
        a, b = after.get(sid), ref.get(sid)
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        torch.testing.assert_close(a["aux"].float(), b["aux"].float(), rtol=1e-2, atol=1e-2)
    assert after.verify() == []
    # a third run finds everything stored: no target forward at all
    again = train(cfg(data, tmp_path / "again", half, online=True))
    assert again["online"]["samples_computed"] == 0
    assert curve(tmp_path / "again") == pytest.approx(curve(off), rel=1e-5)


def test_online_resumes_after_a_crash_and_after_an_oom(data, tmp_path, monkeypatch):
    from eagle3 import oom
    from eagle3.errors import GpuOutOfMemory
    from eagle3.train import online

    torch.set_num_threads(1)
    ref = tmp_path / "ref"
    train(cfg(data, ref, tmp_path / "none", online=True))
    # a crash inside the target forward at the 5th micro-batch, then the same command again
    calls = {"n": 0}
    real = online.OnlineSource._compute

    def crashing(self, ids):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("killed")
        return real(self, ids)

    out = tmp_path / "crashed"
    monkeypatch.setattr(online.OnlineSource, "_compute", crashing)
    with pytest.raises(RuntimeError, match="killed"):
        train(cfg(data, out, tmp_path / "none", online=True))
    monkeypatch.setattr(online.OnlineSource, "_compute", real)
    done = train(cfg(data, out, tmp_path / "none", online=True))
    assert done["steps"] == len(curve(ref))
    assert curve(out) == pytest.approx(curve(ref), rel=1e-5)
    # an OOM in the online step: state saved with half the micro-batch, the retry finishes the same curve
    out = tmp_path / "oom"
    monkeypatch.setenv(oom.INJECT_ENV, "100")
    with pytest.raises(GpuOutOfMemory):
        train(cfg(data, out, tmp_path / "none", online=True))
    monkeypatch.delenv(oom.INJECT_ENV)
    done = train(cfg(data, out, tmp_path / "none", online=True))
    assert done["token_budget"] == 64 and done["grad_accum"] == 2
    assert curve(out) == pytest.approx(curve(ref), rel=1e-4, abs=1e-5)


def test_online_needs_merged_and_model(data, tmp_path):
    from eagle3.errors import InputError

    with pytest.raises(InputError, match="online needs merged"):
        cfg(data, tmp_path / "x", tmp_path / "s", online=True, merged=None)
    with pytest.raises(InputError, match="online mode only"):
        cfg(data, tmp_path / "x", tmp_path / "s", write_back=True)
    with pytest.raises(InputError, match="store is needed offline"):
        cfg(data, tmp_path / "x", None)
    with pytest.raises(InputError, match="store is needed to write back"):
        cfg(data, tmp_path / "x", None, online=True, write_back=True)
    with pytest.raises(InputError, match="for online mode"):
        cfg(data, tmp_path / "x", tmp_path / "s", target_engine="vllm")


def test_online_without_a_store_from_the_command_line(data, tmp_path):
    """`eagle3 train --online --merged M --model T --vocab V --out C`: no --store, nothing written but CKPT."""
    from eagle3.cli import main

    out = tmp_path / "ckpt"
    args = ["train", "--online", "--merged", data["merged"], "--model", data["target"], "--vocab", data["vocab"],
            "--out", str(out), "--max-steps", "2", "--ttt-length", "2", "--token-budget", "128", "--init", "random",
            "--device", "cpu", "--result", str(tmp_path / "result.json")]
    assert main(args) == 0
    import json

    result = json.loads((tmp_path / "result.json").read_text())
    assert result["mode"] == "online" and result["steps"] == 2
    assert result["online"]["samples_from_store"] == 0 and result["online"]["engine"] == "transformers"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "result.json"]


@pytest.mark.slow
def test_online_matches_offline_on_smollm2(tmp_path, smollm2_dir):
    """The real target: extract + train offline vs train online, same data, seed and steps."""
    from eagle3.target import load_tokenizer
    from tests.train.test_train_smollm2 import TEXTS

    torch.set_num_threads(2)
    tok = load_tokenizer(smollm2_dir)
    seqs = [tok(t)["input_ids"] for t in TEXTS[:8]]
    _, vocab = build_store(tmp_path / "vocab-src", smollm2_dir, seqs=seqs, draft_vocab=512)
    samples = [{"id": hashlib.sha256(repr(s).encode()).hexdigest()[:32], "input_ids": s,
                "loss_mask": [0, 0] + [1] * (len(s) - 2)} for s in seqs]
    data = {"root": tmp_path, "target": smollm2_dir, "vocab": vocab,
            "merged": write_merged(tmp_path / "merged", samples)}
    kw = dict(token_budget=64, epochs=2, eval_every=0, save_every=100, init="target", lr=3e-4, heldout_share=0.2)
    off = train(cfg(data, tmp_path / "off", offline_store(data, "bf16"), **kw))
    on = train(cfg(data, tmp_path / "on", tmp_path / "none", online=True, **kw))
    assert on["steps"] == off["steps"] >= 4
    assert curve(tmp_path / "on") == pytest.approx(curve(tmp_path / "off"), rel=1e-4)
    assert on["sim_accept_len"] == pytest.approx(off["sim_accept_len"], rel=1e-3)
    from eagle3.train.data import heldout_split

    trained, held = heldout_split([s["id"] for s in samples], 0.2)
    # no store: every training sample once per epoch, the held-out ones at the final evaluation
    assert on["online"]["samples_computed"] == 2 * len(trained) + len(held)


def test_hybrid_refuses_a_corrupted_stored_shard(data, tmp_path):
    half = Path(offline_store(data, "bf16", shard="0/2", name="store-corrupt"))
    shard = sorted(half.rglob("*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF  # one flipped byte in the tensor data: same size, new mtime
    shard.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="corrupted hidden-state shard") as e:
        train(cfg(data, tmp_path / "on", half, online=True))
    assert shard.name in str(e.value) and "eagle3 extract" in str(e.value)


def test_a_target_server_gets_the_gpus_after_the_trainers(monkeypatch):
    """Online training from a server: this process trains on cuda:0, so the server is given the next
    tp x pp x dp visible GPUs (it inherited them all, GPU 0 included, and could not start beside the trainer)."""
    from types import SimpleNamespace

    import eagle3.extract.served as served
    from eagle3.train import online

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5,6,7,8,9,10,11")
    made = []

    def fake_capture(ecfg, device, longest):
        made.append(SimpleNamespace(server_env={"PYTHONPATH": "x"}, engine={"name": ecfg.engine}))
        return made[-1]

    monkeypatch.setattr(served, "served_capture", fake_capture)
    cfg = SimpleNamespace(merged="m", model="t", store=None, aux_layers=None, storage_option="bf16",
                          precision="auto", target_engine="vllm", target_tensor_parallel_size=8)
    capture, engine = online._target(cfg, "cuda:0", 100)
    assert capture.server_env == {"PYTHONPATH": "x", "CUDA_VISIBLE_DEVICES": "4,5,6,7,8,9,10,11"}
    assert engine == {"name": "vllm"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # 8 visible: one short
    with pytest.raises(InputError, match=r"needs 9 GPUs, 1 for the trainer and 8 for the server .* 8 are visible"):
        online._target(cfg, "cuda:0", 100)
    capture, _ = online._target(cfg, "cpu", 100)  # on the CPU nothing is narrowed
    assert capture.server_env == {"PYTHONPATH": "x"}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_both_served_engines_start_their_server_with_the_given_environment(tiny_llama_dir, tmp_path, engine):
    """What `server_devices` sets reaches the server process's environment (the engines build the server)."""
    from eagle3.extract.served import served_capture

    ecfg = ExtractConfig(merged="m", model=tiny_llama_dir, out=str(tmp_path), engine=engine, device="cpu",
                         storage_option="fp8-topk" if engine == "sglang" else "bf16")
    capture = served_capture(ecfg, "cpu", 64)
    try:
        capture.server_env.update({"CUDA_VISIBLE_DEVICES": "4,5"})
        server = capture._new_server()
        assert {**__import__("os").environ, **server.server_env()}["CUDA_VISIBLE_DEVICES"] == "4,5"
    finally:
        capture.close()
