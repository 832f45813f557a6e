"""Benchmark a draft with real speculative decoding against its target.

  eagle3 evaluate --target smollm2-135m-instruct --draft DRAFT --prompts humaneval --limit 20 --out EVAL

writes EVAL/report.json (acceptance_length τ, lossless, accept_rate_by_position,
tokens_per_s_spec/base, speedup, per-prompt details). Exit code 3 when any
speculative output differs from the target's greedy output.

--backend sglang runs the same prompts through two SGLang servers (baseline and
EAGLE3) on GPUs instead; it needs `pip install sglang` and CUDA.
"""

from __future__ import annotations

import argparse
import json

from eagle3.errors import GateFailed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target model dir, s3:// prefix or smollm2-135m-instruct")
    p.add_argument("--draft", required=True, help="exported draft dir (eagle3 export output)")
    p.add_argument("--prompts", default="humaneval", help='comma-separated sets: "humaneval", "chat" (bundled held-out questions) or JSONL files of '
                   '{"prompt"}/{"messages"} lines; the first set is the headline (default humaneval)')
    p.add_argument("--out", required=True, help="output dir for report.json (local or s3://)")
    p.add_argument("--steps", type=int, default=3, help="draft tokens per verification (default 3)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts of each set")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument("--checkpoint", default=None, help="trainer CKPT/ for the offline simulated τ")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:i] (transformers backend)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--backend", choices=("transformers", "sglang"), default="transformers")
    p.add_argument("--tp", type=int, default=1, help="sglang: tensor-parallel size")
    p.add_argument("--gpus", default=None, help="sglang: comma-separated GPU ids (CUDA_VISIBLE_DEVICES)")
    p.add_argument("--port", type=int, default=30000, help="sglang: server port")


def run(args: argparse.Namespace) -> int:
    if args.backend == "sglang":
        from eagle3.evaluate.sglang_bench import SGLangBenchConfig, sglang_benchmark

        cfg = SGLangBenchConfig(
            target=args.target, draft=args.draft, prompts=args.prompts, out=args.out, num_steps=args.steps,
            num_draft_tokens=args.steps + 1, limit=args.limit, max_new_tokens=args.max_new_tokens, tp=args.tp,
            gpus=[int(g) for g in args.gpus.split(",")] if args.gpus else None, port=args.port,
        )
        print(json.dumps(sglang_benchmark(cfg), indent=2))
        return 0

    from eagle3.evaluate.benchmark import EvaluateConfig, evaluate

    cfg = EvaluateConfig(target=args.target, draft=args.draft, out=args.out, prompts=args.prompts,
                         steps=args.steps, limit=args.limit, max_new_tokens=args.max_new_tokens,
                         checkpoint=args.checkpoint, device=args.device,
                         threads=args.threads)
    try:
        summary = evaluate(cfg)
    except GateFailed as e:
        print(f"eagle3 evaluate: LOSSLESS CHECK FAILED\n{e}")
        return 3
    print(json.dumps(summary, indent=2))
    print(f"tau {summary['acceptance_length']:.3f} (k={cfg.steps}), speedup x{summary['speedup']:.2f} "
          f"({summary['tokens_per_s_spec']:.1f} vs {summary['tokens_per_s_base']:.1f} tok/s), "
          f"lossless={summary['lossless']}")
    return 0
