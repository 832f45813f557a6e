"""The loop on a tiny real store: it learns, logs every TTT step, evaluates, checkpoints."""

from __future__ import annotations

import pytest
import torch

from tests.train.vocab_files import write_vocab

from eagle3.errors import InputError
from eagle3 import checkpoint
from eagle3.train.config import TrainConfig
from eagle3.train.loop import train
from eagle3.checkpoint import read_metrics
from eagle3.devices import resolve_precision
from eagle3.vocab import load_vocab

pytestmark = pytest.mark.precision  # the numbers follow the precision policy (make test forces both)


def cfg_for(tiny_store, out, **kw) -> TrainConfig:
    base = dict(store=tiny_store["store"], vocab=tiny_store["vocab"], out=str(out), ttt_length=3,
                token_budget=96, grad_accum=1, lr=3e-3, log_every=1, eval_every=0, save_every=100, epochs=2,
                heldout_share=0.03, init="random", device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def losses(out) -> list[float]:
    return [r["loss"] for r in read_metrics(str(out / "metrics.jsonl"), "train")]


def test_train_learns_logs_every_ttt_step_and_evaluates(tiny_store, tmp_path):
    torch.set_num_threads(1)
    # One global batch per epoch: the draft must fit it.
    out = tmp_path / "ckpt"
    summary = train(cfg_for(tiny_store, out, token_budget=2048, epochs=14, lr=1e-2, eval_every=7, save_every=7))
    assert summary["steps"] == 14
    rows = read_metrics(str(out / "metrics.jsonl"), "train")
    assert [r["step"] for r in rows] == list(range(1, 15))
    for r in rows:
        assert len(r["loss_i"]) == 3 and len(r["acc_i"]) == 3 and r["tokens_per_s"] > 0 and r["grad_norm"] > 0
        assert r["loss"] == pytest.approx(r["loss_i"][0] + 0.8 * r["loss_i"][1] + 0.64 * r["loss_i"][2])
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
    assert rows[-1]["acc_i"][0] > 0.5 > rows[0]["acc_i"][0]
    evals = read_metrics(str(out / "metrics.jsonl"), "eval")
    assert [e["step"] for e in evals] == [7, 14]
    for e in evals:
        # a position whose target argmax is outside the draft vocab is a miss in decoding: p_i = acc_i x in_vocab_i
        a = [acc * share for acc, share in zip(e["acc_i"], e["in_vocab_i"])]
        assert all(0 < share <= 1 for share in e["in_vocab_i"]) and min(e["in_vocab_i"]) < 1
        assert e["sim_accept_len"] == pytest.approx(1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2])
    assert summary["sim_accept_len"] == pytest.approx(evals[-1]["sim_accept_len"])
    ck = checkpoint.load_latest(str(out))
    assert ck.step == 14 and "d2t" in ck.model and "embed_weight" not in ck.model
    assert checkpoint.list_steps(str(out)) == [7, 14]
    assert ck.state["token_budget"] == 2048 and ck.state["grad_accum"] == 1
    assert ck.state["position"] == {"epoch": 13, "index": 1}
    # started again when done: nothing trained, nothing logged twice, same answer
    lines = (out / "metrics.jsonl").read_text()
    again = train(cfg_for(tiny_store, out, token_budget=2048, epochs=14, lr=1e-2, eval_every=7, save_every=7))
    assert again["steps"] == 14 and again["tokens"] == 0 and (out / "metrics.jsonl").read_text() == lines
    assert again["sim_accept_len"] == pytest.approx(summary["sim_accept_len"])


def test_a_run_stopped_in_its_final_evaluation_evaluates_when_started_again(tiny_store, tmp_path):
    """An out-of-memory in the final held-out evaluation saves the last step and stops; the retry found the run
    at its last step and returned the previous evaluation (None without mid-run ones) as the offline estimate."""
    import json

    out = tmp_path / "ckpt"
    done = train(cfg_for(tiny_store, out, heldout_share=0.2))
    metrics = out / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    final = [r for r in rows if r["event"] == "eval"]
    assert [r["step"] for r in final] == [done["steps"]]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows if r["event"] != "eval"))  # as the OOM left it
    again = train(cfg_for(tiny_store, out, heldout_share=0.2))
    evals = read_metrics(str(metrics), "eval")
    assert [r["step"] for r in evals] == [done["steps"]] and again["steps"] == done["steps"]
    assert again["sim_accept_len"] == pytest.approx(done["sim_accept_len"])
    third = train(cfg_for(tiny_store, out, heldout_share=0.2))  # complete now: nothing to do, no second line
    assert len(read_metrics(str(metrics), "eval")) == 1 and third["sim_accept_len"] == again["sim_accept_len"]


def test_micro_batch_split_does_not_change_the_curve(tiny_store, tmp_path):
    """Same effective batch, 128x1 vs 64x2 vs 32x4 tokens: same steps, same losses (float tolerance)."""
    torch.set_num_threads(1)
    curves = []
    for budget, accum in ((128, 1), (64, 2)):
        out = tmp_path / f"b{budget}"
        train(cfg_for(tiny_store, out, token_budget=budget, grad_accum=accum, max_steps=8, epochs=1))
        curves.append(losses(out))
    assert len(curves[0]) == 8
    # fp32: summation order only; bf16 autocast rounds each micro-batch's matmuls to 8 bits (measured 1.3e-4)
    bf16 = resolve_precision("auto", "cpu").bf16
    assert curves[1] == pytest.approx(curves[0], rel=2e-3 if bf16 else 1e-4, abs=1e-5)


def test_missing_store_and_wrong_vocab_are_input_errors(tiny_store, tmp_path):
    with pytest.raises(InputError, match="no hidden-state store"):
        train(cfg_for(tiny_store, tmp_path / "a", store=str(tmp_path / "nope")))
    bad = write_vocab(tmp_path / "badvocab", range(8), 1000)
    with pytest.raises(InputError, match="vocab_size"):
        train(cfg_for(tiny_store, tmp_path / "b", vocab=str(bad)))
    with pytest.raises(InputError, match="no vocab map"):
        train(cfg_for(tiny_store, tmp_path / "c", vocab=str(tmp_path / "missing")))


def test_resume_keeps_the_checkpoints_vocab_map(tiny_store, tmp_path, caplog):
    """A draft continued from a checkpoint keeps that checkpoint's d2t, even if --vocab now says otherwise."""
    torch.set_num_threads(1)
    out = tmp_path / "ckpt"
    with caplog.at_level("INFO"):
        train(cfg_for(tiny_store, out, max_steps=2))
    original = checkpoint.load_latest(str(out)).model["d2t"]
    v = len(load_vocab(tiny_store["vocab"])[1])
    other = write_vocab(tmp_path / "other-vocab", range(2000, 2064), v)  # another draft vocab of the same size
    first = caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        summary = train(cfg_for(tiny_store, out, max_steps=3, vocab=str(other)))
    assert summary["steps"] == 3
    assert torch.equal(checkpoint.load_latest(str(out)).model["d2t"], original)
    assert "keeping the checkpoint's d2t" in caplog.text
    assert "continues the checkpoint's draft" not in caplog.text  # the same architecture asked for
    # The resumed run's progress names the samples of the first run's 2 steps (that run's own total).
    import re

    trained = re.findall(r"train: \d+/(\d+) samples", first)
    kept = re.findall(r"train: \d+/\d+ samples \(\+(\d+) kept from an earlier run\)", caplog.text)
    assert trained and kept and int(kept[-1]) == int(trained[-1]), (trained, kept)


def test_a_resume_asked_for_another_architecture_says_it_keeps_the_checkpoints(tiny_store, tmp_path, caplog):
    """draft_variant, parallel_drafting and draft_window shape a fresh draft only: a resumed run continues the
    checkpoint's draft, and says so when the run asked for another one."""
    torch.set_num_threads(1)
    out = tmp_path / "ckpt"
    train(cfg_for(tiny_store, out, max_steps=1))
    with caplog.at_level("INFO"):
        summary = train(cfg_for(tiny_store, out, max_steps=2, draft_variant="eagle3.1", parallel_drafting=True))
    assert summary["steps"] == 2
    config = checkpoint.load_latest(str(out)).config
    assert (config["variant"], config.get("parallel_drafting", False)) == ("eagle3", False)
    line = next(x for x in caplog.text.splitlines() if "continues the checkpoint's draft" in x)
    assert "'draft_variant': 'eagle3'" in line and "'draft_variant': 'eagle3.1'" in line
    assert "'parallel_drafting': True" in line and "draft_window" not in line


def test_checkpoints_and_metrics_on_s3(tiny_store, s3_bucket):
    from eagle3 import storage

    torch.set_num_threads(1)
    out = f"{s3_bucket}/ckpt"
    summary = train(cfg_for(tiny_store, out, max_steps=3, save_every=1))
    assert summary["checkpoint"] == f"{out}/{checkpoint.step_dir_name(3)}"
    assert checkpoint.list_steps(out) == [2, 3]
    assert [r["step"] for r in read_metrics(f"{out}/metrics.jsonl", "train")] == [1, 2, 3]
    assert storage.read_json(f"{out}/latest.json")["step"] == 3


def test_merged_restricts_training_to_its_samples(tiny_store, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3.extract.store import HiddenStateStore

    torch.set_num_threads(1)
    ids = HiddenStateStore(tiny_store["store"]).sample_ids()[:20]
    merged = tmp_path / "merged"
    merged.mkdir()
    pq.write_table(pa.table({"id": ids}), merged / "train.parquet")
    out = tmp_path / "ckpt"
    train(cfg_for(tiny_store, out, merged=str(merged), token_budget=4096, epochs=1))
    rows = read_metrics(str(out / "metrics.jsonl"))
    train_tokens = sum(r["tokens"] for r in rows if r["event"] == "train")
    store = HiddenStateStore(tiny_store["store"])
    evals = [r for r in rows if r["event"] == "eval"]
    assert train_tokens + evals[-1]["heldout_tokens"] == sum(store.num_tokens(s) for s in ids)
    pq.write_table(pa.table({"id": ids + ["not-extracted"]}), merged / "train.parquet")
    with pytest.raises(InputError, match="not in the store"):
        train(cfg_for(tiny_store, tmp_path / "other", merged=str(merged)))


def test_a_resume_with_other_settings_says_what_each_change_does(tiny_store, tmp_path, caplog):
    """A resumed run takes some settings from its checkpoint and others from the command line: each one that
    changed is a warning naming what it does, none is silent."""
    import logging

    torch.set_num_threads(1)
    out = tmp_path / "ckpt"
    train(cfg_for(tiny_store, out, max_steps=2, save_every=1))
    with caplog.at_level(logging.WARNING, logger="eagle3.train.loop"):
        train(cfg_for(tiny_store, out, max_steps=3, save_every=1, seed=5, weight_decay=0.1, heldout_share=0.2))
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("seed=5 (the checkpoint's run had 42): the data order" in m for m in said), said
    assert any("weight_decay=0.1 (the checkpoint's run had 0.0): ignored: the optimizer keeps" in m for m in said)
    assert any("heldout_share=0.2 (the checkpoint's run had 0.03): the held-out split changes" in m for m in said)
    assert not any("lr=" in m for m in said)  # unchanged settings say nothing
