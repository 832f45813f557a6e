"""Run the target over the merged dataset and store aux-layer / final-norm hidden states.

Writes STORE/<model_fp>-L<a>_<b>_<c>-<storage>/ (see docs/extract.md). Samples
already in the store are skipped, so a re-run resumes after a crash and extracts
only new data. Exit code 75 after an out-of-memory: the halved token budget is
saved, and a re-run continues with it.

  eagle3 extract --merged MERGED --model smollm2-135m-instruct --out STORE --shard 0/4
"""

from __future__ import annotations

import argparse
import json


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers {text!r}: expected comma-separated layer ids, e.g. 1,14,26")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--merged", required=True, help="merged folder (with train.parquet) or the parquet file")
    parser.add_argument("--model", required=True, help="target: HF directory, s3:// prefix or smollm2-135m-instruct")
    parser.add_argument("--out", required=True, help="store root (local or s3://)")
    parser.add_argument("--shard", default="0/1", help="this task's part I/N of the samples (default 0/1)")
    parser.add_argument("--layers", type=_layers, default=None, help="aux layer ids a,b,c (default 1,L/2-1,L-4)")
    parser.add_argument("--storage", default="bf16", choices=["bf16", "fp8", "fp8-topk"],
                        help="bf16: 8H bytes/token; fp8: 4H+8; fp8-topk: 3H+102 (top-16 log-probs stand in for last)")
    parser.add_argument("--token-budget", type=int, default=8192, help="padded tokens per forward pass")
    parser.add_argument("--shard-mb", type=float, default=256, help="target shard size in MiB")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--tokens-per-s", type=float, default=None,
                        help="throughput for the up-front estimate (default: measured on the first batch)")
    parser.add_argument("--summary-json", default=None, help="also write the summary here")
    parser.add_argument("--no-lean-forward", dest="lean_forward", action="store_false",
                        help="use the transformers forward on CPU too (default: the lean Llama forward where it "
                             "applies; same numbers, faster)")


def run(args: argparse.Namespace) -> int:
    from eagle3 import storage
    from eagle3.extract.stage import ExtractConfig, extract

    cfg = ExtractConfig(merged=args.merged, model=args.model, out=args.out, shard=args.shard, layers=args.layers,
                        storage=args.storage, token_budget=args.token_budget, shard_mb=args.shard_mb,
                        device=args.device, tokens_per_s=args.tokens_per_s, lean_forward=args.lean_forward)
    summary = extract(cfg)
    print(json.dumps(summary, indent=2, sort_keys=True))
    if args.summary_json:
        storage.write_json(args.summary_json, summary)
    return 0
