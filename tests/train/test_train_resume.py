"""A real SIGKILL of a real `eagle3 train` subprocess, then a re-run: it resumes
from the last checkpoint and the loss curve equals an uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.train.train_helpers import REPO, run_cli
from eagle3 import checkpoint
from eagle3.train.loop import train
from eagle3.checkpoint import read_metrics
from tests.train.test_loop import cfg_for, losses

STEPS = 14


def _args(tiny_store, out) -> list[str]:
    return ["--store", tiny_store["store"], "--vocab", tiny_store["vocab"], "--out", str(out),
            "--ttt-length", "3", "--token-budget", "64", "--grad-accum", "1", "--lr", "3e-3", "--epochs", "2",
            "--max-steps", str(STEPS), "--log-every", "1", "--save-every", "1", "--eval-every", "0",
            "--init", "random", "--device", "cpu"]


def test_sigkill_then_rerun_matches_uninterrupted(tiny_store, tmp_path):
    torch.set_num_threads(1)
    ref = tmp_path / "ref"
    train(cfg_for(tiny_store, ref, token_budget=64, max_steps=STEPS, save_every=1))
    ref_curve = losses(ref)
    assert len(ref_curve) == STEPS

    out = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "eagle3.cli", "train", *_args(tiny_store, out)], env=env,
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        try:
            step = json.loads((out / "latest.json").read_text())["step"]
        except (OSError, ValueError):
            step = 0
        if step >= 4:
            proc.send_signal(signal.SIGKILL)
            killed_at = step
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    assert killed_at is not None and proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    resumed_from = checkpoint.load_latest(str(out)).step
    assert 4 <= resumed_from < STEPS

    done = run_cli(_args(tiny_store, out))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    assert summary["steps"] == STEPS
    steps = [r["step"] for r in read_metrics(str(out / "metrics.jsonl"), "train")]
    assert steps == list(range(1, STEPS + 1))  # lines logged after the checkpoint were dropped, not doubled
    assert losses(out) == pytest.approx(ref_curve, rel=1e-4, abs=1e-5)
    # the weights agree too
    a, b = checkpoint.load_latest(str(ref)).model, checkpoint.load_latest(str(out)).model
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
