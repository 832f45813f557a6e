"""bench/train_bench.py --answer-share and --malloc: both ways of the step run side by side and the ratio is
printed (how fast is not asserted here: that is the bench's job)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_answer_share_runs_every_position_and_the_trainers_way_side_by_side():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "train_bench.py"), "--precisions", "float32",
                          "--rows", "2", "--seq-len", "48", "--ttt-length", "3", "--vd", "2048", "--iters", "1",
                          "--threads", "1", "--answer-share", "0.4"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report, _ = json.JSONDecoder().raw_decode(out.stdout)  # the JSON report, then the summary lines
    runs = [(r["answer_share"], r["labels_where_read"]) for r in report["runs"]]
    assert runs == [(0.4, False), (0.4, True)]
    assert all(r["tokens_per_s"] > 0 for r in report["runs"])
    assert "answer share 0.40, float32: labels where read + sparse steps" in out.stdout


def test_malloc_default_and_tuned_run_in_fresh_processes_side_by_side():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "train_bench.py"), "--precisions", "float32",
                          "--rows", "1", "--seq-len", "48", "--ttt-length", "2", "--vd", "2048", "--iters", "1",
                          "--threads", "1", "--malloc", "default,tuned", "--malloc-rounds", "1"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("  default offline float32 [1x48]:") for line in lines), out.stdout
    assert any(line.startswith("  tuned   offline float32 [1x48]:") for line in lines), out.stdout
    assert any(line.startswith("  tuned / default offline float32 [1x48] (CPU time per step):") for line in lines)
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "train_bench.py"), "--malloc", "jemalloc"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--malloc 'jemalloc': use tuned, default" in bad.stderr


def test_counted_flops_are_the_hand_counted_products():
    # SmolLM2's widths (H 576, I 1536, 9 heads of 64, 3 kv heads, V 49152), Vd 2048, TTT 3, counted by hand:
    # per step q 2*1152*576, k and v 2*1152*192 each, o 2*576*576, gate/up/down 3*2*576*1536, lm_head 2*576*2048;
    # fc 2*1728*576 once; train = 3x forward; the target head 2*576*49152, forward only.
    sys.path.insert(0, str(ROOT / "bench"))
    import train_bench

    train_bench.set_shape("smollm2")
    step = 2 * 1152 * 576 + 2 * 2 * 1152 * 192 + 2 * 576 * 576 + 3 * 2 * 576 * 1536 + 2 * 576 * 2048
    assert step == 10_543_104
    assert train_bench.flops_per_token(2048, 3) == {"draft_train": 3 * (3 * step + 2 * 1728 * 576),
                                                    "target_head": 2 * 576 * 49152}


def test_each_run_reports_its_matmuls_alone_beside_it():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "train_bench.py"), "--precisions", "float32",
                          "--rows", "1", "--seq-len", "64", "--ttt-length", "2", "--vd", "2048", "--iters", "1",
                          "--threads", "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report, _ = json.JSONDecoder().raw_decode(out.stdout)
    (run,) = report["runs"]
    # Timed alone, the matmuls cannot be slower per FLOP than inside the whole step (which runs them and more).
    assert run["gemm_ceiling_fraction_of_best_peak"] > run["fraction_of_best_peak"] > 0
    assert run["gemm_ceiling_wall_fraction_of_best_peak"] > 0
    assert "float32  its counted matmuls alone, at the same shapes:" in out.stdout
