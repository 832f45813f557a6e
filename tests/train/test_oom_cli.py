"""GPU OOM through the CLI (fault injector on CPU): exit 75 with the state saved at
half the micro-batch and twice the accumulation; the re-run resumes and its curve
equals a run that started small. Bad input exits 2, never 75."""

from __future__ import annotations

import json

import pytest
import torch

from tests.train.vocab_files import write_vocab

from tests.train.train_helpers import run_cli
from eagle3.errors import GpuOutOfMemory
from eagle3 import checkpoint
from eagle3.train.loop import train
from eagle3.oom import INJECT_ENV
from tests.train.test_loop import cfg_for, losses

STEPS = 6


def _args(tiny_store, out, budget: int, accum: int) -> list[str]:
    return ["--store", tiny_store["store"], "--vocab", tiny_store["vocab"], "--out", str(out),
            "--ttt-length", "3", "--token-budget", str(budget), "--grad-accum", str(accum), "--lr", "3e-3",
            "--max-steps", str(STEPS), "--log-every", "1", "--save-every", "100", "--eval-every", "0",
            "--init", "random", "--device", "cpu"]


def test_oom_exits_75_then_resumes_with_half_micro_batch(tiny_store, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "ckpt"
    env = {INJECT_ENV: "64"}
    first = run_cli(_args(tiny_store, out, 128, 1), env)
    assert first.returncode == GpuOutOfMemory.EXIT_CODE == 75, first.stderr[-3000:]
    assert "out of memory" in first.stderr
    saved = checkpoint.load_latest(str(out))
    assert (saved.state["token_budget"], saved.state["grad_accum"]) == (64, 2)
    assert saved.state["global_tokens"] == 128

    second = run_cli(_args(tiny_store, out, 128, 1), env)  # same command, as a retry would run it
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads(second.stdout[second.stdout.index("{"):])
    assert (summary["token_budget"], summary["grad_accum"], summary["steps"]) == (64, 2, STEPS)

    ref = tmp_path / "small"
    train(cfg_for(tiny_store, ref, token_budget=64, grad_accum=2, max_steps=STEPS))
    assert len(losses(out)) == STEPS
    assert losses(out) == pytest.approx(losses(ref), rel=1e-4, abs=1e-5)


def test_bad_input_exits_2_not_75(tiny_store, tmp_path):
    missing = run_cli(["--store", str(tmp_path / "none"), "--vocab", tiny_store["vocab"], "--out",
                       str(tmp_path / "o")], {INJECT_ENV: "1"})
    assert missing.returncode == 2 and "no hidden-state store" in missing.stderr
    bad = write_vocab(tmp_path / "badvocab", range(8), 1000)
    wrong = run_cli(["--store", tiny_store["store"], "--vocab", str(bad), "--out", str(tmp_path / "o")],
                    {INJECT_ENV: "1"})
    assert wrong.returncode == 2 and "vocab_size" in wrong.stderr
