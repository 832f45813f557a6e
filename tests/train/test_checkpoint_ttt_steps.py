"""TrainConfig.checkpoint_ttt_steps: recomputing each TTT step in backward trains exactly as keeping it; and
TrainConfig.sparse_steps: steps 1.. only where a loss needs them train as running them everywhere."""

from __future__ import annotations

import pytest

from eagle3.devices import resolve_precision
from eagle3.draft import ttt
from eagle3.train.loop import train

from tests.train.test_loop import cfg_for, losses
from tests.train.train_helpers import build_store, peaked_copy


def test_checkpointed_ttt_steps_give_the_same_loss_curve(tiny_store, tmp_path):
    curves = []
    for ckpt in (False, True):
        out = tmp_path / f"ckpt-{ckpt}"
        train(cfg_for(tiny_store, out, max_steps=4, checkpoint_ttt_steps=ckpt))
        curves.append(losses(out))
    plain, checkpointed = curves
    assert len(plain) == 4
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(plain, checkpointed)), (plain, checkpointed)


@pytest.mark.precision  # bf16 rounds the gathered GEMMs differently: make test forces both policies
def test_sparse_steps_give_the_same_loss_curve(tiny_llama_dir, tmp_path, monkeypatch):
    """Prompts of 60% of each sample: the trainer gathers steps 1.. (it did: recorded), and its curve is the
    one of every position, up to float rounding."""
    target = peaked_copy(tiny_llama_dir, tmp_path / "target")
    store, vocab = build_store(tmp_path, target, n=24, prompt_share=0.6)
    gathered = []
    real_rows = ttt._sparse_rows
    monkeypatch.setattr(ttt, "_sparse_rows", lambda *a: gathered.append(real_rows(*a)) or gathered[-1])
    curves = []
    for sparse in (False, True):
        out = tmp_path / f"ckpt-{sparse}"
        train(cfg_for({"store": store, "vocab": vocab}, out, max_steps=4, sparse_steps=sparse))
        curves.append(losses(out))
    every, sparse = curves
    assert len(every) == 4 and any(g is not None for g in gathered)
    tol = 1e-3 if resolve_precision("auto", "cpu").bf16 else 1e-5  # bf16 measured 1.3e-4 here
    assert all(abs(a - b) <= tol * abs(a) for a, b in zip(every, sparse)), (every, sparse)
