"""Settings that would wreck a draft are refused up front; a run whose gradients stop being finite skips those
steps and then stops with an error, and export refuses weights that are not finite."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tests.train.test_loop import cfg_for

from eagle3 import checkpoint
from eagle3.errors import InputError
from eagle3.train.config import TrainConfig
from eagle3.train.loop import NONFINITE_LIMIT, TrainingDiverged, train


@pytest.mark.parametrize("field, value, message", [
    ("grad_clip", 0.0, "grad_clip .* > 0"),  # would zero every update
    ("grad_clip", -1.0, "grad_clip .* > 0"),  # clip_grad_norm_ would flip the gradient's sign
    ("lr", float("inf"), "lr must be a finite number"),
    ("lr", float("nan"), "lr must be a finite number"),
    ("weight_decay", -1.0, "weight_decay"),
    ("betas", (1.5, 0.9), r"betas needs two values in \[0, 1\)"),
    ("betas", (0.9,), "betas needs two values"),
])
def test_settings_that_wreck_the_draft_are_refused(tmp_path, field, value, message):
    with pytest.raises(InputError, match=message):
        TrainConfig(store=str(tmp_path), vocab=str(tmp_path), out=str(tmp_path), **{field: value})


def test_nonfinite_gradients_are_skipped_then_stop_the_run_and_export_refuses_them(tiny_store, tmp_path, caplog):
    torch.set_num_threads(1)
    out = tmp_path / "ckpt"
    # An lr of 1e30 (finite, so allowed) blows the weights up at the first step: every later gradient is NaN/inf.
    cfg = cfg_for(tiny_store, out, lr=1e30, warmup_ratio=0.0, min_lr_ratio=1.0, save_every=1, epochs=20,
                  token_budget=96)
    with caplog.at_level(logging.WARNING, logger="eagle3.train.loop"), \
            pytest.raises(TrainingDiverged, match=rf"NaN/inf for {NONFINITE_LIMIT} steps in a row.*lower --lr"):
        train(cfg)
    skipped = [r for r in caplog.records if "step skipped, weights unchanged" in r.getMessage()]
    assert len(skipped) == NONFINITE_LIMIT - 1
    saved = checkpoint.load_latest(str(out))
    assert saved is not None and all(bool(t.isfinite().all()) for t in saved.model.values()
                                     if t.is_floating_point())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(not torch.isfinite(torch.tensor(r["grad_norm"])) for r in rows if r["event"] == "train")

    from eagle3.export import ExportConfig, export

    step = out / checkpoint.step_dir_name(saved.step)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(step / checkpoint.MODEL_FILE))
    tensors["fc.weight"][0, 0] = float("nan")
    save_file(tensors, str(step / checkpoint.MODEL_FILE))
    state = json.loads((step / checkpoint.STATE_FILE).read_text())
    state.pop("checksums")  # the NaN is what is under test here, not the checksum
    (step / checkpoint.STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(InputError, match=r"NaN or inf in fc.weight .*--step N"):
        export(ExportConfig(checkpoint=str(out), out=str(tmp_path / "draft")))
    assert not (tmp_path / "draft" / "config.json").exists()
