"""Compact hidden-state storage against the bf16 baseline: bytes per token and acceptance length.

For each storage option (bf16, fp8, fp8-topk) this runs the same pipeline on the
same merged dataset and vocab map, with the same seed and settings:

  eagle3 extract --storage-option S  ->  eagle3 train  ->  eagle3 export  ->  eagle3 evaluate

and prints, side by side from this one run: stored bytes per token, the trainer's
held-out simulated τ, the real τ of speculative decoding on each prompt set, and
the relative τ difference to bf16 (the goal: compact within 2%, at <= 4H+8 bytes).

Inputs come from a finished `make demo` run (its merged/ and vocab/ folders):

  .venv/bin/python bench/storage_acceptance_bench.py --run artifacts/runs/eagle3_train/<run_id>
  .venv/bin/python bench/storage_acceptance_bench.py --run RUN --storage-options bf16,fp8 --epochs 1 --limit 3

Each stage runs as its own `eagle3` process; everything is written under --workdir.
"""

from __future__ import annotations

import argparse
import json
import os

from stage_process import run_stage  # bench/ is on sys.path when this script runs

from eagle3 import layout
from eagle3.extract.store_format import STORE_JSON, read_indexes, resolve_store_dir


def bytes_per_token(store: str) -> float:
    """Shard bytes on disk (headers included) over the tokens the shard indexes list."""
    shards, _ = read_indexes(store)
    tokens = sum(int(entry["tokens"]) for entry in shards.values())
    return sum(os.path.getsize(os.path.join(store, shard)) for shard in shards) / tokens if tokens else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a finished eagle3_train run folder (holds merged/ and vocab/)")
    p.add_argument("--storage-options", default="bf16,fp8,fp8-topk")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--ttt-length", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--token-budget", type=int, default=1024)
    p.add_argument("--prompts", default="humaneval,chat")
    p.add_argument("--limit", type=int, default=5, help="prompts per set")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--workdir", default="/tmp/eagle3-storage-bench")
    args = p.parse_args()

    merged, vocab = os.path.join(args.run, "merged"), os.path.join(args.run, "vocab")
    for path in (merged, vocab):
        if not os.path.isdir(path):
            raise SystemExit(f"{path} is missing: pass --run a finished eagle3_train run folder")
    rows = []
    for storage_option in args.storage_options.split(","):
        work = os.path.join(args.workdir, storage_option)
        os.makedirs(work, exist_ok=True)
        times = {}
        times["extract"] = run_stage(["extract", "--merged", merged, "--model", args.model, "--out",
                                os.path.join(work, "store"), "--storage-option", storage_option],
                               os.path.join(work, "extract.log"))
        store = resolve_store_dir(os.path.join(work, "store"))  # the one store extract created there
        times["train"] = run_stage(["train", "--store", store, "--vocab", vocab, "--merged", merged, "--out",
                              os.path.join(work, "ckpt"), "--epochs", str(args.epochs), "--ttt-length",
                              str(args.ttt_length), "--lr", str(args.lr), "--token-budget", str(args.token_budget),
                              "--seed", "0"], os.path.join(work, "train.log"))
        times["export"] = run_stage(["export", "--checkpoint", os.path.join(work, "ckpt"), "--out",
                               os.path.join(work, "draft")], os.path.join(work, "export.log"))
        times["evaluate"] = run_stage(["evaluate", "--target", args.model, "--draft", os.path.join(work, "draft"),
                                 "--prompts", args.prompts, "--limit", str(args.limit), "--max-new-tokens",
                                 str(args.max_new_tokens), "--steps", str(args.steps), "--checkpoint",
                                 os.path.join(work, "ckpt"), "--out", os.path.join(work, "eval")],
                                os.path.join(work, "evaluate.log"))
        report = json.load(open(os.path.join(work, "eval", layout.EVAL_REPORT)))
        info = json.load(open(os.path.join(store, STORE_JSON)))
        row = {"storage_option": storage_option, "bytes_per_token": bytes_per_token(store),
               "hidden_size": info.get("hidden_size"),
               "sim_tau": report.get("sim_accept_len_k"), "lossless": report["lossless"],
               "tau": {name: s["acceptance_length"] for name, s in report["sets"].items()}, "seconds": times}
        rows.append(row)
        print(json.dumps(row), flush=True)

    base = next((r for r in rows if r["storage_option"] == "bf16"), rows[0])
    h = base["hidden_size"]
    sets = list(base["tau"])
    print(f"\nstorage bench: {args.model} (H={h}), {args.epochs} epochs, TTT {args.ttt_length}, k={args.steps}, "
          f"{args.limit} prompts x {args.max_new_tokens} tokens per set; goal: <= 4H+8 = {4 * h + 8} B/token "
          f"and τ within 2% of {base['storage_option']}")
    print(f"{'option':>9} {'B/token':>8} {'vs bf16':>7} | {'sim τ':>6} | "
          + " | ".join(f"{'τ ' + s[:10]:>13} {'Δ':>6}" for s in sets) + " | lossless")
    for r in rows:
        cells = []
        for s in sets:
            t, t0 = r["tau"].get(s), base["tau"].get(s)
            cells.append(f"{t:>13.3f} {100 * (t - t0) / t0:>+5.1f}%" if t and t0 else f"{'-':>13} {'-':>6}")
        print(f"{r['storage_option']:>9} {r['bytes_per_token']:>8.0f} {r['bytes_per_token'] / base['bytes_per_token']:>7.2f} | "
              f"{r['sim_tau'] or float('nan'):>6.3f} | " + " | ".join(cells) + f" | {r['lossless']}")


if __name__ == "__main__":
    main()
