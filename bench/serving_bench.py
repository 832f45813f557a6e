"""The same exported draft in vLLM and in the project decoder, side by side in one run.

    .venv/bin/python bench/serving_bench.py --draft DRAFT [--target smollm2-135m-instruct]
        [--prompts humaneval,chat] [--limit 5] [--max-new-tokens 64] [--steps 3] [--out /tmp/serving-bench]

One evaluate stage with backend transformers and compare_with vllm (eagle3.evaluate.compare): the same
prompts, greedy, fp32, decoded by the project's decoder in this process and by two vLLM servers
(baseline, then EAGLE-3 with the draft). Prints per engine τ and the acceptance rate per draft position,
each with a 95% bootstrap interval over prompts, tokens/s with and without speculation, the lossless
verdict, the vLLM start times, and whether the engines agree within their intervals.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time


def _starts(starts: dict | None) -> str:
    return "-" if not starts else f"{starts['baseline']:.0f} + {starts['eagle3']:.0f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", required=True, help="an `eagle3 export` folder")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--prompts", default="humaneval,chat")
    p.add_argument("--limit", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="/tmp/serving-bench")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from eagle3.evaluate import EvaluateConfig, evaluate

    t0 = time.monotonic()
    summary = evaluate(EvaluateConfig(model=args.target, draft=args.draft, out=args.out, prompts=args.prompts,
                                      limit=args.limit, max_new_tokens=args.max_new_tokens, steps=args.steps,
                                      device="cpu", precision="float32", compare_with=("vllm",)))
    wall = time.monotonic() - t0

    def ci(point, iv):
        return "n/a" if point is None else f"{point:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")

    k = args.steps
    print(f"\n{summary['primary_set']}: {summary['num_prompts']} prompts x {args.max_new_tokens} tokens, k={k}, "
          f"fp32, {wall:.0f} s in all\n")
    print("| engine | τ [95% CI] | " + " | ".join(f"P(accept) pos {i + 1}" for i in range(k))
          + " | tok/s spec | tok/s base | speedup | lossless | server starts (s) |")
    print("|---" * (6 + k) + "|")
    for name in summary["engine_order"]:
        e = summary["engines"][name]
        starts = e.get("server_start_s")
        print(f"| {name} | {ci(e['tau'], e['tau_interval'])} | "
              + " | ".join(ci(r, iv) for r, iv in zip(e["accept_rate_by_position"], e["rate_intervals"]))
              + f" | {e['tokens_per_s_spec']:.1f} | {e['tokens_per_s_base']:.1f} | {e['speedup']:.2f} | "
              f"{e['lossless']} | {_starts(starts)} |")
    for name, a in summary["agreement"].items():
        print(f"\n{name} vs {a['against']}: {'agree' if a['agree'] else 'DISAGREE'} within the intervals "
              f"(τ difference {ci(a['tau']['difference'], a['tau']['interval'])}); same greedy output on "
              f"{a['same_greedy_output']} of {a['prompts_compared']} prompts")
    print(json.dumps({k_: summary[k_] for k_ in ("engines", "agreement")}, default=str), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
