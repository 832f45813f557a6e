"""Checkpoints: atomic step folders, latest.json, pruning, optimizer + RNG round trips, no pickle."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from eagle3 import checkpoint as ck
from eagle3.checkpoint import state as ck_state


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    names = {p: n for n, p in model.named_parameters()}
    return model, opt, names


def test_save_load_roundtrip_restores_weights_optimizer_and_state(tmp_path):
    model, opt, names = _model_and_opt()
    tensors, meta = ck_state.optimizer_tensors(opt, names)
    ck.save(str(tmp_path), 3, model.state_dict(), tensors, {"opt": meta, "position": {"epoch": 1, "index": 2}},
            {"hidden_size": 4})
    got = ck.load_latest(str(tmp_path))
    assert got.step == 3 and got.state["position"] == {"epoch": 1, "index": 2} and got.config == {"hidden_size": 4}
    for k, v in model.state_dict().items():
        assert torch.equal(got.model[k], v)

    # A fresh optimizer loaded from the files takes the same next step as the original.
    model2, opt2, names2 = _model_and_opt()
    with torch.no_grad():
        for p2, p in zip(model2.parameters(), model.parameters()):
            p2.copy_(p)
    torch.optim.AdamW(model2.parameters(), lr=1.0)  # unrelated optimizer must not matter
    opt3 = torch.optim.AdamW(model2.parameters(), lr=1.0, betas=(0.9, 0.95))
    ck_state.load_optimizer(opt3, got.optimizer, got.state["opt"], {p: n for n, p in model2.named_parameters()})
    assert opt3.param_groups[0]["lr"] == pytest.approx(1e-2)
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (model2, opt3)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, p2)


def test_files_are_safetensors_and_json_only(tmp_path):
    model, opt, names = _model_and_opt()
    tensors, meta = ck_state.optimizer_tensors(opt, names)
    ck.save(str(tmp_path), 1, model.state_dict(), tensors, {"opt": meta}, {})
    files = sorted(p.name for p in (tmp_path / ck.step_dir_name(1)).iterdir())
    assert files == ["config.json", "model.safetensors", "optimizer.safetensors", "train_state.json"]
    assert json.loads((tmp_path / "latest.json").read_text()) == {"step": 1, "dir": ck.step_dir_name(1)}
    for f in (tmp_path / ck.step_dir_name(1)).glob("*.safetensors"):
        assert b"pickle" not in f.read_bytes()[:2000]


def test_keeps_last_two_and_ignores_half_written_folders(tmp_path):
    model, opt, names = _model_and_opt()
    tensors, meta = ck_state.optimizer_tensors(opt, names)
    import subprocess
    import sys

    from eagle3 import storage

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = storage.tmp_prefix("x").split("-")[-1].rstrip(".")
    (tmp_path / f".step-00000009.{dead.pid}-{host}.abc.tmp").mkdir(parents=True)  # a save killed half-way
    for step in (1, 2, 3, 4):
        ck.save(str(tmp_path), step, model.state_dict(), tensors, {"opt": meta}, {}, keep=2)
    assert ck.list_steps(str(tmp_path)) == [3, 4]
    assert ck.load_latest(str(tmp_path)).step == 4
    assert not list(tmp_path.glob(".step-*"))


def test_no_checkpoint_yet_returns_none(tmp_path):
    assert ck.load_latest(str(tmp_path / "nothing")) is None


def test_rng_state_roundtrip_through_json():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    state = json.loads(json.dumps(ck_state.rng_state()))
    a = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    ck_state.set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_s3_checkpoint_roundtrip(s3_bucket):
    model, opt, names = _model_and_opt()
    tensors, meta = ck_state.optimizer_tensors(opt, names)
    uri = f"{s3_bucket}/ckpt"
    for step in (5, 6, 7):
        ck.save(uri, step, model.state_dict(), tensors, {"opt": meta}, {"k": step})
    assert ck.list_steps(uri) == [6, 7]
    got = ck.load_latest(uri)
    assert got.step == 7 and got.config == {"k": 7}
    assert torch.equal(got.model["0.weight"], model.state_dict()["0.weight"])


def _saved(tmp_path, step=3):
    model, opt, names = _model_and_opt()
    tensors, meta = ck_state.optimizer_tensors(opt, names)
    ck.save(str(tmp_path), step, model.state_dict(), tensors, {"opt": meta}, {"hidden_size": 4})
    return tmp_path / ck.step_dir_name(step)


@pytest.mark.parametrize("name", [ck.MODEL_FILE, ck.OPTIMIZER_FILE])
def test_a_damaged_weight_file_is_refused_by_name_on_resume_and_export(tmp_path, name):
    from eagle3.errors import InputError

    step = _saved(tmp_path)
    sums = json.loads((step / ck.STATE_FILE).read_text())["checksums"]
    assert set(sums) == {ck.MODEL_FILE, ck.OPTIMIZER_FILE}
    data = bytearray((step / name).read_bytes())
    data[-3] ^= 1  # one bit in the tensor data: safetensors itself would load it
    (step / name).write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"{name}: sha256 .* differs from train_state.json's .*--step N"):
        ck.load_latest(str(tmp_path))
    if name == ck.MODEL_FILE:  # export reads only the weights
        with pytest.raises(InputError, match=rf"{name}: sha256"):
            ck.read_step(str(step))
    else:  # export still reads the intact weights
        assert set(ck.read_step(str(step))[1]) == {"0.weight", "0.bias", "1.weight", "1.bias"}


def test_a_cut_weight_file_without_a_checksum_is_named_not_a_safetensors_traceback(tmp_path):
    from eagle3.errors import DamagedFile

    step = _saved(tmp_path)
    state = json.loads((step / ck.STATE_FILE).read_text())
    del state["checksums"]  # a checkpoint written before checksums were recorded
    (step / ck.STATE_FILE).write_text(json.dumps(state))
    assert ck.load_latest(str(tmp_path)).step == 3  # read unchecked
    (step / ck.MODEL_FILE).write_bytes((step / ck.MODEL_FILE).read_bytes()[:40])
    with pytest.raises(DamagedFile, match=rf"{ck.MODEL_FILE}: not a readable safetensors file"):
        ck.read_step(str(step))


def test_a_torn_metrics_line_is_left_out_with_a_warning_not_a_stop(tmp_path, caplog):
    import logging

    from eagle3.checkpoint.metrics import MetricsLog, read_metrics

    log = MetricsLog(str(tmp_path))
    for step in (1, 2, 3):
        log.write({"event": "train", "step": step, "loss": 1.0 / step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "train", "step": 4, "loss": 0.2')  # killed in the middle of a write
    uri = str(tmp_path / "metrics.jsonl")
    with caplog.at_level(logging.WARNING):
        assert [r["step"] for r in read_metrics(uri)] == [1, 2, 3]
        MetricsLog(str(tmp_path), truncate_after=2)  # a resume from step 2
    assert any(f"{uri}:4: not a metrics event" in r.getMessage() for r in caplog.records)
    assert [r["step"] for r in read_metrics(uri)] == [1, 2]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


@pytest.mark.parametrize("swap", [True, False])
def test_a_kill_while_re_saving_the_only_step_keeps_a_step_to_resume(tmp_path, monkeypatch, swap):
    """The OOM path re-saves the current step. With one step on disk, a kill between moving the old folder aside
    and renaming the new one in left no complete step: the run started over from a fresh draft. The folder is now
    swapped in one atomic step (RENAME_EXCHANGE), so at every moment one complete step-5 is there."""
    import os

    from eagle3 import storage

    model, opt, names = _model_and_opt()
    tensors, meta = ck_state.optimizer_tensors(opt, names)
    ck.save(str(tmp_path), 5, model.state_dict(), tensors, {"opt": meta, "micro": 512}, {})
    real_rename = os.rename

    def killed(src, dst, *a, **k):  # the process dies right after moving the old folder aside
        real_rename(src, dst, *a, **k)
        if ".old" in str(dst):
            raise SystemExit("killed between the renames")

    if not swap:  # a filesystem without RENAME_EXCHANGE (NFS): the two renames, and their window, remain
        monkeypatch.setattr(storage, "_exchange", lambda a, b: False)
    monkeypatch.setattr(os, "rename", killed)
    try:
        ck.save(str(tmp_path), 5, model.state_dict(), tensors, {"opt": meta, "micro": 256}, {})
    except SystemExit:
        assert not swap
    monkeypatch.setattr(os, "rename", real_rename)
    got = ck.load_latest(str(tmp_path))
    if swap:
        assert got is not None and got.step == 5 and got.state["micro"] == 256
        assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []  # the old folder is gone
    else:
        assert got is None  # the window this fixes where it can
