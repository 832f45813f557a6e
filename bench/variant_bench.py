"""EAGLE-3 against EAGLE 3.1 at the same training budget, paired, in vLLM.

Takes a finished `make demo` run (its store, vocab, merged dataset and checkpoint), trains the OTHER draft variant
with the run's own training config and exactly the run's step count and schedule (a time-budgeted run's fixed count
and warm-up), exports it, then evaluates both drafts with vLLM (`eagle3 evaluate --backend vllm`) on the same
prompts, and prints τ of each with a paired bootstrap of the difference (eagle3.acceptance.paired_agreement).

    .venv/bin/python bench/variant_bench.py --run artifacts/runs/eagle3_train/<run_id> [--limit 10]

Each stage runs as its own `eagle3` process; everything is written under --workdir (default RUN/variant_bench).
"""

from __future__ import annotations

import argparse
import json
import os

from stage_process import run_stage  # bench/ is on sys.path when this script runs (and puts REPO there)


def main() -> None:
    from eagle3 import checkpoint
    from eagle3.acceptance import paired_agreement, tau_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a finished eagle3_train run folder")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    work = args.workdir or os.path.join(args.run, "variant_bench")
    os.makedirs(work, exist_ok=True)
    ckpt_dir = checkpoint.latest_step_dir(os.path.join(args.run, "checkpoint"))
    state = json.load(open(os.path.join(ckpt_dir, "train_state.json")))
    tc = dict(state["train_config"])
    trained = json.load(open(os.path.join(ckpt_dir, "config.json"))).get("variant", "eagle3")
    other = "eagle3.1" if trained == "eagle3" else "eagle3"
    steps = int(state["total_steps"])
    budget = state.get("budget") or {}
    warmup = int(budget.get("warmup") or max(1, round(tc["warmup_ratio"] * steps)))
    # Same data, settings and schedule; the step count fixed, not re-timed (the machine's load differs now).
    tc.update(out=os.path.join(work, f"checkpoint-{other}"), draft_variant=other, train_time_budget=0.0,
              max_steps=steps, epochs=int(state["position"]["epoch"]) + 2, warmup_ratio=warmup / steps)
    tc = {k: v for k, v in tc.items() if v is not None}
    cfg_path = os.path.join(work, f"train-{other}.json")
    json.dump(tc, open(cfg_path, "w"), indent=1)
    print(f"training {other} for {steps} steps (warm-up {warmup}) as the run trained {trained}", flush=True)
    run_stage(["train", "--config", cfg_path], os.path.join(work, f"train-{other}.log"))
    drafts = {trained: os.path.join(args.run, "draft"), other: os.path.join(work, f"draft-{other}")}
    run_stage(["export", "--checkpoint", tc["out"], "--out", drafts[other]], os.path.join(work, f"export-{other}.log"))
    reports = {}
    for variant, draft in drafts.items():
        out = os.path.join(work, f"eval-{variant}")
        print(f"evaluating {variant} in vLLM", flush=True)
        run_stage(["evaluate", "--model", tc["model"] or "smollm2-135m-instruct", "--draft", draft, "--out", out,
             "--prompts", args.prompts, "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens),
             "--steps", str(args.steps), "--backend", "vllm"], os.path.join(work, f"eval-{variant}.log"))
        reports[variant] = json.load(open(os.path.join(out, "report.json")))
    counts = {v: [p["counts"] for p in r["prompts"]] for v, r in reports.items()}
    same = [p["id"] for p in reports[trained]["prompts"]] == [p["id"] for p in reports[other]["prompts"]]
    pair = paired_agreement(counts["eagle3.1"], counts["eagle3"]) if same else None
    out = {"steps": steps, "warmup": warmup, "prompts": args.prompts, "limit": args.limit,
           "tau": {v: tau_of(c) for v, c in counts.items()},
           "lossless": {v: r["lossless"] for v, r in reports.items()},
           "eagle3.1_minus_eagle3": pair}
    json.dump(out, open(os.path.join(work, "variant_bench.json"), "w"), indent=1)
    print(json.dumps(out, indent=1))
    if pair:
        d = pair["tau"]
        print(f"vLLM, {args.prompts} x {args.limit}, k={args.steps}: tau eagle3 {out['tau']['eagle3']:.3f}, eagle3.1 "
              f"{out['tau']['eagle3.1']:.3f}; 3.1 - 3 = {d['difference']:+.3f} (95% paired interval {d['interval']})")


if __name__ == "__main__":
    main()
