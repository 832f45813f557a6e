"""Online training fed by an SGLang server (``target_engine="sglang"``) against offline training on a store the
sglang engine wrote, both against the fake SGLang server (tests/evaluate/fake_sglang_server.py: real states and
log-probs from a transformers model, one forward per request). No real SGLang runs here.

The oracle is the offline pipeline: ``eagle3 extract --engine sglang`` fills an fp8-topk store and the trainer
reads it. Online, the same server's answers go through the same codec in the training process, so on the same
data, seed and steps the loss curves are equal; the samples written back record the sglang engine.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from eagle3.checkpoint import read_metrics
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore
from eagle3.train.config import TrainConfig
from eagle3.train.loop import train
from tests.extract.extract_testdata import REPO, write_merged
from tests.train.train_helpers import _sequences, build_store, peaked_copy

pytestmark = pytest.mark.precision


@pytest.fixture
def data(tmp_path, tiny_llama_dir, monkeypatch) -> dict:
    monkeypatch.setenv("EAGLE3_SGLANG_MODULE", "fake_sglang_server")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests" / "evaluate"), str(REPO),
                                                      os.environ.get("PYTHONPATH", "")]))
    target = peaked_copy(tiny_llama_dir, tmp_path / "target")
    seqs = _sequences(16, seed=4)
    _, vocab = build_store(tmp_path / "vocab-src", target, seqs=seqs)
    samples = [{"id": hashlib.sha256(repr(s).encode()).hexdigest()[:32], "input_ids": s,
                "loss_mask": [0, 0, 0] + [1] * (len(s) - 3)} for s in seqs]
    return {"root": tmp_path, "target": target, "vocab": vocab, "merged": write_merged(tmp_path / "merged", samples)}


def _cfg(data, out, store, **kw) -> TrainConfig:
    base = dict(store=store, vocab=data["vocab"], out=str(data["root"] / out), merged=data["merged"],
                model=data["target"], storage_option="fp8-topk", ttt_length=2, token_budget=128, lr=3e-3, log_every=1,
                eval_every=0, save_every=100, epochs=2, heldout_share=0.1, init="random", device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def _curve(data, out) -> list[float]:
    return [r["loss"] for r in read_metrics(str(data["root"] / out / "metrics.jsonl"), "train")]


def test_online_from_sglang_follows_the_curve_of_the_sglang_store(data):
    torch.set_num_threads(1)
    store = str(data["root"] / "store")
    extract(ExtractConfig(merged=data["merged"], model=data["target"], out=store, engine="sglang",
                          storage_option="fp8-topk", device="cpu"))
    off = train(_cfg(data, "offline", store))
    on = train(_cfg(data, "online", str(data["root"] / "write-back"), online=True, target_engine="sglang",
                    write_back=True))
    assert on["mode"] == "online" and on["steps"] == off["steps"] >= 4
    assert _curve(data, "online") == pytest.approx(_curve(data, "offline"), rel=1e-6)
    stats = on["online"]
    assert stats["engine"] == "sglang" and stats["samples_computed"] > 0 and stats["server_start_s"] > 0
    back = HiddenStateStore(str(data["root"] / "write-back"))
    assert len(back.sample_ids()) == stats["samples_written_back"] > 0
    assert set(back.engines(back.sample_ids())) == {"sglang"}


def test_the_cli_takes_target_engine_sglang():
    from eagle3.cli import build_parser
    from eagle3.config import config_from_args

    args = build_parser().parse_args(["train", "--online", "--merged", "m", "--model", "t", "--vocab", "v",
                                      "--out", "o", "--storage-option", "fp8-topk", "--target-engine", "sglang",
                                      "--target-tensor-parallel-size", "4"])
    cfg = config_from_args(TrainConfig, args)
    assert (cfg.target_engine, cfg.target_tensor_parallel_size, cfg.storage_option) == ("sglang", 4, "fp8-topk")
