"""Training benchmark: draft tokens/s and the achieved fraction of fp32 matmul peak.

SmolLM2-sized draft (H=576, I=1536, 9 heads, 3 kv heads, V=49152) on synthetic
data, one optimizer step per iteration exactly as the loop runs a micro-batch:
target_from_last (the target's lm_head over `last`, forward only), ttt_forward
over --ttt-length steps, backward, grad clip, AdamW. Peak = a big torch.mm in
the same run, same dtype (fp32), same threads.

Counted FLOPs per token (2*m*n*k per matmul, backward = 2x forward, so train = 3x):
  per TTT step: q/k/v (2H in), o, MLP gate/up/down, draft lm_head (H x Vd); fc (3H -> H) at step 0 only;
  once: target lm_head (H x V, forward only, no grad).
Attention score/value products (O(T^2)) are NOT counted, so the fraction is a lower bound.

usage: .venv/bin/python bench/train_bench.py [--vd 8192] [--rows 4] [--seq-len 512] [--ttt-length 7] [--iters 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from eagle3.draft import DraftConfig, Eagle3Draft  # noqa: E402
from eagle3.draft.ttt import target_from_last, ttt_forward  # noqa: E402

H, I, HEADS, KV, V = 576, 1536, 9, 3, 49152


def timed(fn, device: str, repeat: int) -> tuple[float, float]:
    """(best wall seconds, best process CPU seconds) of ``fn`` after one warm-up call.

    CPU seconds (all threads of this process) are what we compare on a shared
    CPU: a busy machine time-slices us, which stretches wall time but not the
    CPU time spent per FLOP. On CUDA only wall time means anything.
    """
    fn()
    _sync(device)
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def matmul_peak(device: str, n: int = 2048, repeat: int = 5) -> tuple[float, float]:
    """fp32 GFLOP/s of an n x n x n torch.mm: (by wall time, by process CPU time)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    wall, cpu = timed(lambda: a @ b, device, repeat)
    return 2 * n**3 / wall / 1e9, 2 * n**3 / cpu / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def flops_per_token(vd: int, ttt_length: int) -> dict[str, float]:
    hd = H // HEADS
    step = 2 * (2 * H) * (HEADS * hd) + 2 * 2 * (2 * H) * (KV * hd) + 2 * (HEADS * hd) * H  # q, k+v, o
    step += 3 * 2 * H * I + 2 * H * vd  # MLP, draft lm_head
    draft_fwd = ttt_length * step + 2 * (3 * H) * H  # + fc at step 0
    return {"draft_train": 3 * draft_fwd, "target_head": 2 * H * V}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vd", type=int, default=8192, help="draft vocab (8192 or 32000)")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--ttt-length", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA; the loop's GPU setting)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    dev = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = DraftConfig(hidden_size=H, intermediate_size=I, num_attention_heads=HEADS, num_key_value_heads=KV,
                      head_dim=H // HEADS, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=8192,
                      vocab_size=V, draft_vocab_size=args.vd, aux_layer_ids=(1, 14, 26))
    d2t = torch.randperm(V)[: args.vd].sort().values - torch.arange(args.vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.arange(args.vd) + d2t] = True
    draft = Eagle3Draft(cfg, torch.randn(V, H) * 0.02, d2t, t2d).to(dev)
    for p in draft.parameters():
        torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.ones_(p)
    head = (torch.randn(V, H) * 0.05).to(dev)
    opt = torch.optim.AdamW(draft.parameters(), lr=1e-4, betas=(0.9, 0.95))
    b, t = args.rows, args.seq_len
    batch = {"input_ids": torch.randint(0, V, (b, t), device=dev), "aux": torch.randn(b, t, 3 * H, device=dev),
             "last": torch.randn(b, t, H, device=dev), "loss_mask": torch.ones(b, t, dtype=torch.long, device=dev)}

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.bf16):
            with torch.no_grad():
                logits, in_draft = target_from_last(batch["last"], head, draft.d2t, draft.t2d)
            res = ttt_forward(draft, batch["input_ids"], batch["aux"], logits, torch.ones_like(in_draft),
                              batch["loss_mask"], ttt_length=args.ttt_length)
        opt.zero_grad(set_to_none=True)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
        opt.step()

    peak_wall, peak_cpu = matmul_peak(dev)
    sec, cpu_sec = timed(step, dev, args.iters)
    peak_wall = max(peak_wall, matmul_peak(dev)[0])  # again after the steps: the machine may be shared
    tokens = b * t
    f = flops_per_token(args.vd, args.ttt_length)
    counted = (f["draft_train"] + f["target_head"]) * tokens
    out = {
        "device": dev, "threads": torch.get_num_threads(), "bf16_autocast": args.bf16, "vd": args.vd,
        "rows": b, "seq_len": t, "ttt_length": args.ttt_length, "step_wall_s": round(sec, 3),
        "step_cpu_s": round(cpu_sec, 3), "tokens_per_s": round(tokens / sec, 1),
        "matmul_peak_gflops_wall": round(peak_wall, 1), "matmul_peak_gflops_cpu": round(peak_cpu, 1),
        "counted_gflops_wall": round(counted / sec / 1e9, 1),
        "fraction_of_peak_wall": round(counted / sec / 1e9 / peak_wall, 3),
        "fraction_of_peak_cpu": round(counted / cpu_sec / 1e9 / peak_cpu, 3),
        "draft_only_fraction_of_peak_cpu": round(f["draft_train"] * tokens / cpu_sec / 1e9 / peak_cpu, 3),
        "gflop_per_token": {k: round(v / 1e9, 4) for k, v in f.items()},
    }
    print(json.dumps(out, indent=1))
    key = "fraction_of_peak_cpu" if dev == "cpu" else "fraction_of_peak_wall"
    print(f"train: {out['tokens_per_s']:,.0f} tok/s (wall) | counted matmuls at {100 * out[key]:.0f}% of the "
          f"torch.mm peak ({key}; goal >= 50%)")


if __name__ == "__main__":
    main()
