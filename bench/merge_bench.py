"""Merge benchmark: a seed-style merge against `eagle3 merge`, side by side in one run.

Input: the seed's JSONL format ({"input_ids": [...], "loss_mask": [...]} per line),
generated here: samples of 200-1800 tokens (mean ~1000), a prompt part with mask 0
and an answer part with mask 1, 0.5% exact duplicates.

  (a) seed-style: json.loads every line into Python lists, truncate, drop samples without
      loss tokens, random.shuffle, json.dumps every line (what existing scripts do)
  (b) eagle3: the product's own path. `eagle3 tokenize` ingests the seed JSONL as a
      `tokenized` dataset once (validates every record, content ids, counts, rejects,
      fingerprint) into PREP/bench/tokenized.parquet; then `eagle3 merge` (truncate,
      no-loss drop, dedupe, seeded bucketed shuffle, Parquet + manifest), which is the
      part a re-run with a new seed, max_seq_len or drop list repeats

Each step runs in its own subprocess; wall time, CPU time and peak RSS come from
os.wait4 on that child. Prints per size: seconds, s per million tokens, peak RSS, and
the ratios of (b) as a whole and of its merge step alone against (a).

  .venv/bin/python bench/merge_bench.py                    # 10K, 30K, 100K samples (~100M tokens)
  .venv/bin/python bench/merge_bench.py --quick            # 2K and 5K samples, seconds
  .venv/bin/python bench/merge_bench.py --sizes 10000,30000 --workdir /tmp/mb
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = "smollm2-135m-instruct"  # the ingest checks ids against its vocab (49,152)


def generate(path: str, n: int, seed: int, mean_len: int) -> int:
    """Write n seed-format lines; returns the number of tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = 0
    prev = None
    with open(path, "w") as f:
        for i in range(n):
            if prev is not None and rng.random() < 0.005:
                f.write(prev)  # an exact duplicate
                tokens += prev.count(",") // 2 + 1
                continue
            k = int(rng.integers(mean_len // 5, 2 * mean_len - mean_len // 5))
            prompt = int(rng.integers(1, k))
            ids = ", ".join(rng.integers(0, 49152, k).astype(str).tolist())  # json.dumps spacing
            mask = ", ".join(["0"] * prompt + ["1"] * (k - prompt))
            prev = f'{{"input_ids": [{ids}], "loss_mask": [{mask}]}}\n'
            f.write(prev)
            tokens += k
    return tokens


def seed_style(src: str, out: str, max_len: int, seed: int) -> None:
    """(a) What existing pipelines do: Python lists all the way."""
    import random

    samples = []
    with open(src) as f:
        for line in f:
            d = json.loads(line)
            ids, mask = d["input_ids"][:max_len], d["loss_mask"][:max_len]
            if sum(mask) == 0:
                continue
            samples.append({"input_ids": ids, "loss_mask": mask})
    random.Random(seed).shuffle(samples)
    with open(out, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")


def convert_child(src: str, workdir: str) -> None:
    """`eagle3 tokenize` on a `tokenized` dataset: what a user runs once to ingest seed-format JSONL."""
    from eagle3.tokenize.stage import DatasetConfig, tokenize_dataset

    tokenize_dataset(DatasetConfig(name="bench", source=src, format="tokenized", tokenizer=TOKENIZER,
                                    out=os.path.join(workdir, "prep")))


def merge_child(workdir: str, max_len: int, seed: int) -> None:
    from eagle3.merge import MergeConfig, merge

    merge(MergeConfig(prepared=os.path.join(workdir, "prep"), out=os.path.join(workdir, "merged"),
                      max_seq_len=max_len, seed=seed))


def measure(args: list[str]) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS in MiB, stdout) of one child process, via os.wait4."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": REPO})
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"child {args[0]} failed with exit code {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,30000,100000", help="sample counts to run (comma-separated)")
    p.add_argument("--mean-len", type=int, default=1000, help="mean tokens per sample (default 1000)")
    p.add_argument("--max-seq-len", type=int, default=1536, help="truncation length (default 1536)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--quick", action="store_true", help="2K and 5K samples of ~400 tokens")
    p.add_argument("--workdir", default="/tmp/eagle3-merge-bench", help="scratch folder (deleted after)")
    args = p.parse_args()
    sizes = [2000, 5000] if args.quick else [int(s) for s in args.sizes.split(",")]
    mean_len = 400 if args.quick else args.mean_len
    os.makedirs(args.workdir, exist_ok=True)
    rows = []
    try:
        for n in sizes:
            src = os.path.join(args.workdir, f"seed-{n}.jsonl")
            t0 = time.monotonic()
            tokens = generate(src, n, args.seed, mean_len)
            gen_s = time.monotonic() - t0
            a_s, a_cpu, a_rss, _ = measure(["_seed", src, os.path.join(args.workdir, f"seed-out-{n}.jsonl"),
                                     str(args.max_seq_len), str(args.seed)])
            work = os.path.join(args.workdir, f"eagle3-{n}")
            c_s, c_cpu, c_rss, _ = measure(["_convert", src, work])
            m_s, m_cpu, m_rss, _ = measure(["_merge", work, str(args.max_seq_len), str(args.seed)])
            b_s, b_cpu, b_rss = c_s + m_s, c_cpu + m_cpu, max(c_rss, m_rss)
            mtok = tokens / 1e6
            row = {"samples": n, "tokens": tokens, "input_mb": os.path.getsize(src) / 2**20, "generate_s": gen_s,
                   "seed_s": a_s, "seed_cpu_s": a_cpu, "seed_rss_mb": a_rss,
                   "convert_s": c_s, "convert_cpu_s": c_cpu, "convert_rss_mb": c_rss,
                   "merge_s": m_s, "merge_cpu_s": m_cpu, "merge_rss_mb": m_rss,
                   "eagle3_s": b_s, "eagle3_cpu_s": b_cpu, "eagle3_rss_mb": b_rss,
                   "seed_s_per_mtok": a_s / mtok, "eagle3_s_per_mtok": b_s / mtok, "merge_s_per_mtok": m_s / mtok,
                   "speedup": a_s / b_s, "cpu_speedup": a_cpu / b_cpu, "rss_ratio": b_rss / a_rss,
                   "merge_speedup": a_s / m_s, "merge_cpu_speedup": a_cpu / m_cpu, "merge_rss_ratio": m_rss / a_rss}
            rows.append(row)
            print(json.dumps(row), flush=True)
            for f in (src, os.path.join(args.workdir, f"seed-out-{n}.jsonl")):
                os.unlink(f)
            shutil.rmtree(work)
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print(f"\nmerge bench: max_seq_len {args.max_seq_len}, seed {args.seed}, {os.cpu_count()} CPUs")
    print("(b) = convert seed JSONL to the prepared Parquet + merge, each in its own process; merge = that"
          " second process alone. wall = elapsed s; cpu = user+sys s of the child (steadier on a shared machine);"
          " RSS = peak resident MiB (os.wait4).")
    print(f"{'samples':>8} {'Mtok':>5} | {'seed wall':>9} {'cpu':>6} {'RSS':>6} | {'(b) wall':>8} {'cpu':>6} "
          f"{'RSS':>5} | {'merge wall':>10} {'cpu':>5} {'RSS':>5} | {'s/Mtok seed':>11} {'(b)':>5} {'merge':>5} | "
          f"{'speedup (b)':>11} {'cpu':>5} {'merge':>5} {'cpu':>5} | {'RSS ratio (b)':>13} {'merge':>5}")
    for r in rows:
        print(f"{r['samples']:>8} {r['tokens'] / 1e6:>5.1f} | {r['seed_s']:>9.1f} {r['seed_cpu_s']:>6.1f} "
              f"{r['seed_rss_mb']:>6.0f} | {r['eagle3_s']:>8.1f} {r['eagle3_cpu_s']:>6.1f} {r['eagle3_rss_mb']:>5.0f} | "
              f"{r['merge_s']:>10.1f} {r['merge_cpu_s']:>5.1f} {r['merge_rss_mb']:>5.0f} | "
              f"{r['seed_s_per_mtok']:>11.2f} {r['eagle3_s_per_mtok']:>5.2f} {r['merge_s_per_mtok']:>5.2f} | "
              f"{r['speedup']:>10.1f}x {r['cpu_speedup']:>4.1f}x {r['merge_speedup']:>4.1f}x "
              f"{r['merge_cpu_speedup']:>4.1f}x | {r['rss_ratio']:>13.3f} {r['merge_rss_ratio']:>5.3f}")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_seed":
        seed_style(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_convert":
        convert_child(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "_merge":
        merge_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
