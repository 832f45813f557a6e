"""A real CUDA out-of-memory through the train CLI (no fault injector): another tenant holds the GPU's memory but
enough for half the micro-batch, as a colocated server would. The run exits 75 with the state saved at half the
micro-batch and twice the accumulation; the same command then resumes and finishes. The CPU suite tests the same
path with the injector (tests/train/test_oom_cli.py); this one needs a GPU (run on an H200 on 2026-12-04)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch

from eagle3 import checkpoint, memory
from eagle3.errors import GpuOutOfMemory
from tests.tiny_llama import save_random_llama, tiny_llama_config
from tests.train.train_helpers import build_store, run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SEQ, ROWS, VD, TTT = 2048, 32, 8192, 7
"""One micro-batch of 32 rows of 2048 tokens: ~37 GiB predicted in bf16 at these widths, ~19 GiB at half."""

HOG = """
import sys, torch
leave = int(sys.argv[1])
free, _ = torch.cuda.mem_get_info()
held = torch.empty(max(0, free - leave), dtype=torch.uint8, device="cuda")
print(torch.cuda.mem_get_info()[0], flush=True)
sys.stdin.read()
"""


def test_a_real_cuda_oom_exits_75_and_the_same_command_resumes_at_half(tmp_path):
    cfg = tiny_llama_config(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)
    target = save_random_llama(tmp_path / "target", cfg, str(tmp_path))
    rng = random.Random(0)
    seqs = [[rng.randrange(3, 32000) for _ in range(SEQ)] for _ in range(2 * ROWS + 8)]
    store, vocab = build_store(tmp_path, target, seqs=seqs, draft_vocab=VD, device="cuda")

    shape = memory.DraftShape.from_target(cfg.to_dict(), VD)
    need = {b: memory.training_peak(shape, b, TTT, "bfloat16")["bytes"] for b in (ROWS * SEQ, ROWS * SEQ // 2)}
    leave = sum(need.values()) // 2  # room for half the micro-batch, not for all of it
    free, total = torch.cuda.mem_get_info()
    if free < need[ROWS * SEQ] + 4 * memory.GiB:
        pytest.skip(f"the GPU has {free / memory.GiB:.0f} GiB free; this test needs the whole micro-batch to fit "
                    "before the other tenant takes its share")
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(leave)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        left = int(hog.stdout.readline())
        assert abs(left - leave) < memory.GiB, (left, leave)
        args = ["--store", store, "--vocab", vocab, "--out", str(tmp_path / "ckpt"), "--ttt-length", str(TTT),
                "--token-budget", str(ROWS * SEQ), "--grad-accum", "1", "--max-steps", "2", "--log-every", "1",
                "--save-every", "100", "--eval-every", "0", "--init", "random", "--device", "cuda",
                "--precision", "bfloat16"]
        first = run_cli(args, timeout=600)
        assert first.returncode == GpuOutOfMemory.EXIT_CODE == 75, first.stderr[-3000:]
        assert "CUDA out of memory" in first.stderr and "injected" not in first.stderr
        saved = checkpoint.load_latest(str(tmp_path / "ckpt"))
        assert (saved.state["token_budget"], saved.state["grad_accum"]) == (ROWS * SEQ // 2, 2)

        second = run_cli(args, timeout=600)  # the same command, as the task's retry runs it
        assert second.returncode == 0, second.stderr[-3000:]
        summary = json.loads(second.stdout[second.stdout.index("{"):])
        assert (summary["token_budget"], summary["grad_accum"], summary["steps"]) == (ROWS * SEQ // 2, 2, 2)
        print(f"\nreal CUDA OOM at {ROWS * SEQ} tokens (predicted {need[ROWS * SEQ] / memory.GiB:.1f} GiB, "
              f"{left / memory.GiB:.1f} GiB left by the other tenant); resumed at {ROWS * SEQ // 2} x 2 "
              f"(predicted {need[ROWS * SEQ // 2] / memory.GiB:.1f} GiB)")
    finally:
        hog.stdin.close()
        hog.wait(timeout=60)
