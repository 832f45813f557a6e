"""Extraction speed and stored bytes on the real SmolLM2-135M (or any target), side by side.

Prints, from ONE process: tokens/s of the extract stage, the fp32 matmul peak of
this machine measured in the same run (a big torch.mm), the achieved fraction
of that peak (model matmul FLOPs / forward time) for the lean CPU forward and,
on the same samples, for the transformers forward, the padding share of the
batches, and the stored bytes per token of each storage option (from the files
written, next to the 8H+5 formula).

    .venv/bin/python bench/extract_bench.py --samples 300 --out bench/extract_bench.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import tempfile
import time
from pathlib import Path


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GFLOP/s of an n x n x n torch.mm (the machine's practical peak)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def write_samples(folder: Path, n: int, seed: int, vocab: int, max_len: int) -> list[int]:
    """Chat-like long-tailed lengths (lognormal, median ~250 tokens), random token ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = min(max_len, max(16, int(rng.lognormvariate(5.5, 0.6))))
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        mask = [0] * (length // 4) + [1] * (length - length // 4)
        rows.append((hashlib.sha256(repr(ids).encode()).hexdigest()[:32], ids, mask))
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "id": [r[0] for r in rows],
        "input_ids": pa.array([r[1] for r in rows], pa.list_(pa.int32())),
        "loss_mask": pa.array([r[2] for r in rows], pa.list_(pa.uint8())),
    }), folder / "train.parquet")
    return [len(r[1]) for r in rows]


def planned_padding(lengths: list[int], budget: int) -> float:
    """Padding share of the stage's own batch plan for these lengths."""
    from eagle3.extract.plan import Sample, cut_batches, order, padding_share

    samples = order([Sample(f"{i:06d}", n) for i, n in enumerate(lengths)])
    real, padded = padding_share(cut_batches(samples, budget))
    return 1 - real / padded


def model_flops(cap, lengths: list[int]) -> float:
    """Matmul FLOPs of the forward pass over the real tokens: 2 x (non-embedding)
    params per token, plus causal attention 2 x L x n^2 x H per sample (QK^T and PV,
    half the square each)."""
    cfg = cap.model.config
    dense = 2 * cap.params() * sum(lengths)
    attn = sum(2 * cfg.num_hidden_layers * n * n * cfg.hidden_size for n in lengths)
    return float(dense + attn)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--token-budget", type=int, default=8192)
    p.add_argument("--bytes-samples", type=int, default=24, help="samples extracted per compact option")
    p.add_argument("--plan-samples", type=int, default=300,
                   help="also report the planned padding share for this many samples (no model run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--no-compare", dest="compare_transformers", action="store_false",
                   help="skip the second run through the transformers forward")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    import torch

    from eagle3.extract.capture import TargetCapture
    from eagle3.storage_options import OPTIONS, bytes_per_token
    from eagle3.extract import ExtractConfig, extract
    from eagle3.extract.store import HiddenStateStore

    cap = TargetCapture(args.model, "cpu")
    with tempfile.TemporaryDirectory(prefix="extract-bench-") as tmp:
        tmp = Path(tmp)
        lengths = write_samples(tmp / "merged", args.samples, args.seed, cap.vocab_size, args.max_len)
        plan_lengths = write_samples(tmp / "plan", args.plan_samples, args.seed + 2, cap.vocab_size, args.max_len)
        planned = planned_padding(plan_lengths, args.token_budget)
        peak_before = matmul_peak_gflops()
        runs = {}
        for path, lean in (("lean", True), ("transformers", False)):
            cfg = ExtractConfig(merged=str(tmp / "merged"), model=args.model, out=str(tmp / f"store-{path}"),
                                device="cpu", token_budget=args.token_budget, progress_every_s=30, lean_forward=lean)
            t0 = time.perf_counter()
            s = extract(cfg)
            runs[path] = {"summary": s, "wall": time.perf_counter() - t0, "forward": s["forward"]}
            if not args.compare_transformers:
                break
        peak_after = matmul_peak_gflops()
        peak = max(peak_before, peak_after)
        for r in runs.values():
            forward_s = r["summary"]["tokens"] / r["summary"]["tokens_per_s"]
            r["achieved"] = model_flops(cap, lengths) / forward_s / 1e9
        summary, wall, achieved = runs["lean"]["summary"], runs["lean"]["wall"], runs["lean"]["achieved"]

        stored = {}
        small = tmp / "small"
        write_samples(small, args.bytes_samples, args.seed + 1, cap.vocab_size, args.max_len)
        for option in OPTIONS:
            s = extract(ExtractConfig(merged=str(small), model=args.model, out=str(tmp / f"store-{option}"),
                                      device="cpu", storage=option, token_budget=args.token_budget))
            store = HiddenStateStore(s["store"])
            files = sum((Path(store.uri) / name).stat().st_size for name in store.shards)
            stored[option] = {"bytes_per_token_files": round(files / s["tokens"], 1),
                              "bytes_per_token_formula": bytes_per_token(option, cap.hidden_size),
                              "bytes_per_token_at_H7168": bytes_per_token(option, 7168)}
    result = {
        "model": args.model, "hidden_size": cap.hidden_size, "layers": cap.layers, "samples": args.samples,
        "tokens": summary["tokens"], "token_budget": args.token_budget, "threads": torch.get_num_threads(),
        "tokens_per_s": summary["tokens_per_s"], "wall_s": round(wall, 1),
        "padding_share": summary["padding_share"],
        "planned_padding_share": {"samples": args.plan_samples, "share": round(planned, 4)},
        "matmul_peak_gflops": round(peak, 1), "peak_before_after": [round(peak_before, 1), round(peak_after, 1)],
        "model_gflops_per_s": round(achieved, 1), "fraction_of_peak": round(achieved / peak, 3),
        "forward": runs["lean"]["forward"],
        "paths": {k: {"forward": r["forward"], "tokens_per_s": r["summary"]["tokens_per_s"],
                      "fraction_of_peak": round(r["achieved"] / peak, 3)} for k, r in runs.items()},
        "bytes_per_token": stored,
    }
    print(f"{'model':28s} {args.model} (H={cap.hidden_size}, layers {cap.layers}, {result['threads']} threads)")
    print(f"{'samples / tokens':28s} {args.samples} / {summary['tokens']}  (budget {args.token_budget})")
    print(f"{'extract tokens/s':28s} {summary['tokens_per_s']:.0f}  (wall {wall:.1f} s incl. writes)")
    print(f"{'model matmul GFLOP/s':28s} {achieved:.1f}  vs torch.mm peak {peak:.1f}  -> "
          f"{100 * achieved / peak:.0f}% of peak  ({runs['lean']['forward']} forward)")
    if "transformers" in runs:
        hf = runs["transformers"]
        print(f"{'  transformers forward':28s} {hf['summary']['tokens_per_s']:.0f} tok/s, {hf['achieved']:.1f} GFLOP/s "
              f"-> {100 * hf['achieved'] / peak:.0f}% of peak; lean/transformers = "
              f"{summary['tokens_per_s'] / hf['summary']['tokens_per_s']:.2f}x")
    print(f"{'padding share':28s} {100 * summary['padding_share']:.2f}% measured; "
          f"{100 * planned:.2f}% planned for {args.plan_samples} samples")
    for option, b in stored.items():
        print(f"{'bytes/token ' + option:28s} {b['bytes_per_token_files']:.0f} in files, formula "
              f"{b['bytes_per_token_formula']} (H=7168: {b['bytes_per_token_at_H7168']}, "
              f"{b['bytes_per_token_at_H7168'] / stored['bf16']['bytes_per_token_at_H7168']:.2f}x bf16)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
