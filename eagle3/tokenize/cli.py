"""Tokenize the datasets of a manifest with the tokenizer's chat template and exact loss masks.

For each dataset (or only --dataset NAME) this writes PREP/<name>/:
  tokenized.parquet  id, input_ids, loss_mask, num_tokens, num_loss_tokens, source
  stats.json         counts, reject reasons, fingerprint
  rejects.jsonl      every refused input line: {"file", "line", "reason", "detail"}
  fingerprint.json   input hash + tokenizer + chat template + settings

The loss mask is 1 on each assistant turn's generated text and its end-of-turn
token, 0 on role headers, system, user and tool turns. A dataset whose
fingerprint is unchanged is skipped (use --force to redo it). The task fails if
more than --max-reject-share of a dataset's records are refused.

example:
  eagle3 tokenize --manifest data/manifest.yaml --tokenizer smollm2-135m-instruct --out prep/
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", required=True, metavar="M.yaml",
                        help="datasets manifest (YAML with a top-level 'datasets:' list; local or s3://)")
    parser.add_argument("--tokenizer", required=True, metavar="T",
                        help="tokenizer/model directory, s3:// prefix, or the alias smollm2-135m-instruct")
    parser.add_argument("--out", required=True, metavar="PREP", help="prepared folder (local or s3://)")
    parser.add_argument("--dataset", metavar="NAME", help="tokenize only this dataset of the manifest")
    parser.add_argument("--max-reject-share", type=float, default=0.05, metavar="F",
                        help="fail a dataset when more than this share of its records is refused (default 0.05)")
    parser.add_argument("--batch-size", type=int, default=1024, metavar="N",
                        help="conversations per encode_batch call (default 1024)")
    parser.add_argument("--force", action="store_true", help="tokenize again even if the fingerprint is unchanged")


def run(args: argparse.Namespace) -> int:
    from eagle3.tokenize.stage import tokenize_manifest

    results = tokenize_manifest(args.manifest, args.tokenizer, args.out, dataset=args.dataset,
                                max_reject_share=args.max_reject_share, batch_size=args.batch_size,
                                force=args.force)
    print(json.dumps(results, indent=2))
    return 0
