"""Extraction speed per compute precision and stored bytes on the real SmolLM2-135M (or any target), side by side.

Prints, from ONE process: the fp32 and the bf16 torch.mm peaks of this machine
(eagle3.devices.mm_peaks, measured before and after the runs), what the precision
policy picks here and why, then for each precision of --precisions and each forward
(the lean CPU forward and, on the same samples, the transformers forward): tokens/s
of the extract stage and the achieved fraction of the BEST peak (the larger of the
two; model matmul FLOPs / forward time) and of its own dtype's peak; the padding share
of the batches; and the stored bytes per token of each storage option (from the files
written, next to the 8H+5 formula; the format does not depend on the precision).

A precision whose peak is under 10% of the best (bf16 on an AVX2-only CPU) runs on the
first --slow-samples samples only, so the bench stays short.

``--engines transformers,vllm`` also runs the vllm engine (a vLLM server in extraction mode) on the same
samples at each precision: its tokens/s (the forward only; the server's start is reported apart) next to
the transformers engine's, and for every run the peak memory (PSS summed over this process and all its
descendants, the server's workers included; and the part of it above the level before the run).

    .venv/bin/python bench/extract_bench.py --samples 300 --out bench/extract_bench.json
    .venv/bin/python bench/extract_bench.py --samples 100 --precisions bfloat16 --engines transformers,vllm
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import tempfile
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's eagle3, not an installed one


def write_samples(folder: Path, n: int, seed: int, vocab: int, max_len: int) -> list[int]:
    """Chat-like long-tailed lengths (lognormal, median ~250 tokens), random token ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3 import layout
    from eagle3.datasets.samples import content_id  # the id tokenize and merge give a sample

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = min(max_len, max(16, int(rng.lognormvariate(5.5, 0.6))))
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        mask = [0] * (length // 4) + [1] * (length - length // 4)
        rows.append((content_id(ids, mask), ids, mask))
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "id": [r[0] for r in rows],
        "input_ids": pa.array([r[1] for r in rows], pa.list_(pa.int32())),
        "loss_mask": pa.array([r[2] for r in rows], pa.list_(pa.uint8())),
    }), folder / layout.MERGED_PARQUET)
    return [len(r[1]) for r in rows]


def _memory_of(pid: int) -> int:
    """Proportional set size of a process in bytes (shared pages split among their users), else its RSS."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return 0


def _family(root: int) -> list[int]:
    """root and every live descendant (a vLLM server runs in a session of its own, but stays our child)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [p for p, parent in parents.items() if parent == pid]
    return out


class PeakMemory:
    """Samples the memory of this process and its descendants every ``every_s`` while the block runs."""

    def __init__(self, every_s: float = 0.5):
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()
        self.before = self.total()

    @staticmethod
    def total() -> int:
        return sum(_memory_of(p) for p in _family(os.getpid()))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.total())

    def __enter__(self) -> "PeakMemory":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.before)

    def to_dict(self) -> dict:
        return {"peak_mib": round(self.peak / 2**20), "added_mib": round((self.peak - self.before) / 2**20)}


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
    p.add_argument("--precisions", default="float32,bfloat16",
                   help="comma-separated compute precisions to run side by side (float32, bfloat16)")
    p.add_argument("--slow-samples", type=int, default=6,
                   help="samples for a precision whose torch.mm peak is under 10%% of the best (the slow path)")
    p.add_argument("--bytes-samples", type=int, default=24, help="samples extracted per compact option")
    p.add_argument("--plan-samples", type=int, default=300,
                   help="also report the planned padding share for this many samples (no model run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--no-compare", dest="compare_transformers", action="store_false",
                   help="skip the second run through the transformers forward")
    p.add_argument("--engines", default="transformers",
                   help="comma-separated extract engines to run on the same samples (transformers, vllm)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    import torch

    from eagle3.devices import best_peak, check_precision, is_slow_path, mm_peaks, resolve_precision
    from eagle3.extract.capture import TargetCapture
    from eagle3.storage_options import OPTIONS, bytes_per_token
    from eagle3.extract import ExtractConfig, extract
    from eagle3.extract.store import HiddenStateStore

    precisions = [check_precision(x.strip(), "--precisions") for x in args.precisions.split(",") if x.strip()]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    paths = [("lean", True, "transformers"), ("transformers", False, "transformers")] if "transformers" in engines else []
    if not args.compare_transformers:
        paths = paths[:1]
    paths += [("vllm", True, "vllm")] if "vllm" in engines else []
    policy = resolve_precision("auto", "cpu")
    cap = TargetCapture(args.model, "cpu", precision="float32")  # shapes and parameter count only
    with tempfile.TemporaryDirectory(prefix="extract-bench-") as tmp:
        tmp = Path(tmp)
        lengths = write_samples(tmp / "merged", args.samples, args.seed, cap.vocab_size, args.max_len)
        # The same generator: the first --slow-samples samples of the full set.
        slow_lengths = write_samples(tmp / "merged-slow", min(args.slow_samples, args.samples), args.seed,
                                     cap.vocab_size, args.max_len)
        plan_lengths = write_samples(tmp / "plan", args.plan_samples, args.seed + 2, cap.vocab_size, args.max_len)
        planned = planned_padding(plan_lengths, args.token_budget)
        before = mm_peaks("cpu")
        runs = {}
        for precision in precisions:
            slow = is_slow_path(before, precision)
            merged, used = (tmp / "merged-slow", slow_lengths) if slow else (tmp / "merged", lengths)
            for path, lean, engine in paths:
                cfg = ExtractConfig(merged=str(merged), model=args.model, out=str(tmp / f"store-{precision}-{path}"),
                                    device="cpu", token_budget=args.token_budget, progress_every_s=30,
                                    lean_forward=lean, precision=precision, engine=engine)
                t0, c0 = time.perf_counter(), time.process_time()
                with PeakMemory() as mem:
                    s = extract(cfg)
                runs[(precision, path)] = {"summary": s, "wall": time.perf_counter() - t0, "forward": s["forward"],
                                           "cpu_s": time.process_time() - c0, "memory": mem.to_dict(),
                                           "samples": len(used), "flops": model_flops(cap, used), "slow": slow}
        peaks = mm_peaks("cpu", earlier=before)
        best = best_peak(peaks)
        for (precision, path), r in runs.items():
            forward_s = r["summary"]["tokens"] / r["summary"]["tokens_per_s"]
            r["achieved"] = r["flops"] / forward_s / 1e9
            r["of_best"], r["of_own"] = r["achieved"] / best.gflops, r["achieved"] / peaks[precision].gflops
            # By CPU time of the whole stage call (model load, encode and writes included: a lower bound), against
            # the CPU-time peak: what a shared CPU, whose other jobs stretch wall time, still measures fairly.
            r["of_best_cpu"] = r["flops"] / r["cpu_s"] / 1e9 / best_peak(peaks, cpu_time=True).gflops_cpu
            if path == "vllm":  # its forward runs in the server's processes, not on this process's CPU clock
                r["of_best_cpu"] = None

        stored = {}
        small = tmp / "small"
        write_samples(small, args.bytes_samples, args.seed + 1, cap.vocab_size, args.max_len)
        for option in OPTIONS:
            s = extract(ExtractConfig(merged=str(small), model=args.model, out=str(tmp / f"store-{option}"),
                                      device="cpu", storage_option=option, token_budget=args.token_budget,
                                      precision="float32"))
            store = HiddenStateStore(s["store"])
            files = sum((Path(store.uri) / name).stat().st_size for name in store.shards)
            stored[option] = {"bytes_per_token_files": round(files / s["tokens"], 1),
                              "bytes_per_token_formula": bytes_per_token(option, cap.hidden_size),
                              "bytes_per_token_at_H7168": bytes_per_token(option, 7168)}
    head = runs.get((policy.name, "lean")) or next(iter(runs.values()))
    result = {
        "model": args.model, "hidden_size": cap.hidden_size, "aux_layers": cap.aux_layers, "samples": args.samples,
        "token_budget": args.token_budget, "threads": torch.get_num_threads(),
        "policy": policy.to_dict(), "peaks": {d: pk.to_dict() for d, pk in peaks.items()}, "best_peak": best.dtype,
        "peaks_before": {d: pk.to_dict() for d, pk in before.items()},
        # headline: the lean forward at the precision the policy picks here
        "tokens": head["summary"]["tokens"], "tokens_per_s": head["summary"]["tokens_per_s"],
        "wall_s": round(head["wall"], 1), "padding_share": head["summary"]["padding_share"],
        "model_gflops_per_s": round(head["achieved"], 1), "fraction_of_best_peak": round(head["of_best"], 3),
        "forward": head["forward"],
        "planned_padding_share": {"samples": args.plan_samples, "share": round(planned, 4)},
        "runs": [{"precision": prec, "path": path, "forward": r["forward"], "samples": r["samples"],
                  "tokens": r["summary"]["tokens"], "tokens_per_s": r["summary"]["tokens_per_s"],
                  "model_gflops_per_s": round(r["achieved"], 1), "fraction_of_best_peak": round(r["of_best"], 3),
                  "fraction_of_own_peak": round(r["of_own"], 3),
                  "fraction_of_best_peak_cpu_time": r["of_best_cpu"] and round(r["of_best_cpu"], 3),
                  "slow_path_subset": r["slow"],
                  "memory": r["memory"], "server_start_s": r["summary"].get("server_start_s"),
                  "wall_s": round(r["wall"], 1)}
                 for (prec, path), r in runs.items()],
        "bytes_per_token": stored,
    }
    print(f"{'model':28s} {args.model} (H={cap.hidden_size}, aux layers {cap.aux_layers}, {result['threads']} threads)")
    print(f"{'torch.mm peaks':28s} fp32 {peaks['float32'].gflops:.1f} GFLOP/s (n={peaks['float32'].n}), "
          f"bf16 {peaks['bfloat16'].gflops:.1f} GFLOP/s (n={peaks['bfloat16'].n}); best: {best.dtype}")
    print(f"{'policy (auto) here':28s} {policy.name}: {policy.reason}")
    for (precision, path), r in runs.items():
        sub = f", first {r['samples']} samples (slow path)" if r["slow"] else ""
        print(f"{'extract ' + precision + ' ' + path:28s} {r['summary']['tokens_per_s']:.0f} tok/s, "
              f"{r['achieved']:.1f} GFLOP/s -> {100 * r['of_best']:.0f}% of the best peak, "
              f"{100 * r['of_own']:.0f}% of the {precision} peak; "
              + (f"by CPU time {100 * r['of_best_cpu']:.0f}% of the best " if r["of_best_cpu"] is not None else "")
              + f"({r['summary']['tokens']} tokens{sub}); peak memory {r['memory']['peak_mib']} MiB "
              f"({r['memory']['added_mib']:+d} MiB in the run)"
              + (f"; server start {r['summary']['server_start_s']:.0f} s (not in tok/s)" if path == "vllm" else ""))
    print(f"{'padding share':28s} {100 * head['summary']['padding_share']:.2f}% measured; "
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
