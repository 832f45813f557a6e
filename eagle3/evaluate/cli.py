"""Benchmark a draft with real speculative decoding against its target.

  eagle3 evaluate --target smollm2-135m-instruct --draft DRAFT --prompts humaneval --limit 20 --out EVAL

writes EVAL/report.json (acceptance_length τ, lossless, accept_rate_by_position,
tokens_per_s_spec/base, speedup, per-prompt details). Exit code 3 when any
speculative output differs from the target's greedy output.

--backend vllm serves the target twice with vLLM (baseline, then EAGLE-3 with the
draft) on 127.0.0.1; --backend sglang does the same with SGLang on GPUs.
--compare-with vllm also runs vLLM on the same prompts and sets both engines' τ and
per-position acceptance side by side in report.json (`engines`, `agreement`).
"""

from __future__ import annotations

from eagle3.config import stage_cli
from eagle3.evaluate import EvaluateConfig, evaluate
from eagle3.devices import PRECISIONS
from eagle3.evaluate.config import BACKENDS


def _evaluate_and_say(cfg: EvaluateConfig) -> dict:
    summary = evaluate(cfg)
    print(f"{cfg.backend}: tau {summary['acceptance_length']:.3f} (k={cfg.steps}), speedup x{summary['speedup']:.2f} "
          f"({summary['tokens_per_s_spec']:.1f} vs {summary['tokens_per_s_base']:.1f} tok/s), "
          f"lossless={summary['lossless']}")
    for name in cfg.compare_with:
        e, a = summary["engines"][name], summary["agreement"][name]
        print(f"{name}: tau {e['tau']:.3f} {e['tau_interval']}, speedup x{e['speedup']:.2f}, lossless={e['lossless']}; "
              f"{'agrees' if a['agree'] else 'DISAGREES'} with {cfg.backend} within the intervals")
    return summary


add_arguments, run = stage_cli(EvaluateConfig, _evaluate_and_say, aliases={"model": ["--target"]},
                               choices={"backend": BACKENDS, "precision": PRECISIONS})
