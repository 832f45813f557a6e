"""Two drafts that differ in one setting, same data, same steps, paired in vLLM.

Takes a finished eagle3_train run and trains its draft again with ONE setting changed:

  --vary draft_variant   EAGLE-3 <-> EAGLE 3.1
  --vary parallel_drafting   a chain (k draft forwards a round) <-> P-EAGLE (one); the speed-ups are printed too,
                         since P-EAGLE trades acceptance for drafting time
  --vary seed            the same data in another order and another init: how far two drafts differ by training
                         noise alone, the yardstick for the other two (the paired interval covers the prompts,
                         not the training)
  --vary target_engine   the hidden states from the other engine (transformers <-> vllm): the run's merged
                         dataset is extracted again, with the same layers, storage option and precision, into a
                         store of this bench's own (the shared store would find every sample already there);
                         an online run trains online again, from the other engine

with the run's own training config and exactly its step count and warm-up (a time-budgeted run's fixed count),
exports it, evaluates it in vLLM (`eagle3 evaluate --backend vllm`) on the run's headline prompts, and prints τ of
both with a paired bootstrap of the difference (eagle3.acceptance.paired_agreement). The run's own vLLM figures
(EVAL/vllm_report.json, or report.json when vLLM was the primary backend) are reused when they measured the same
prompts with the same settings; otherwise the run's draft is evaluated again.

    .venv/bin/python bench/paired_bench.py --run artifacts/runs/eagle3_train/<run_id> --vary draft_variant
    .venv/bin/python bench/paired_bench.py --run RUN --vary target_engine --limit 10

Each stage runs as its own `eagle3` process; everything is written under --workdir (default RUN/paired-<vary>),
and the result to WORKDIR/paired.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.stage_process import run_stage  # noqa: E402  (after the path)
from eagle3 import layout  # noqa: E402
VARIES = ("draft_variant", "parallel_drafting", "target_engine", "seed")
OTHER = {"draft_variant": {"eagle3": "eagle3.1", "eagle3.1": "eagle3"}, "parallel_drafting": {False: True, True: False},
         "target_engine": {"transformers": "vllm", "vllm": "transformers", "sglang": "transformers"}}


def other_value(vary: str, mine):
    """The value the second draft trains with: the other variant or engine, or the next seed."""
    return mine + 1 if vary == "seed" else OTHER[vary][mine]


def label(vary: str, value) -> str:
    """A value's name in the output: P-EAGLE's booleans by what they mean."""
    return {True: "parallel", False: "chain"}[value] if vary == "parallel_drafting" else str(value)
# What must match for the run's own vLLM report to stand for a new evaluation of its draft.
SAME_BENCHMARK = ("prompts_source", "num_prompts", "steps", "max_new_tokens")


def run_layout(run: str):
    """The eagle3.layout of a run folder <root>/runs/<dag_id>/<run_id>."""
    from eagle3.layout import RunLayout

    path = os.path.abspath(run)
    return RunLayout(os.path.dirname(os.path.dirname(os.path.dirname(path))), os.path.basename(os.path.dirname(path)),
                     os.path.basename(path))


def run_inputs(run: str) -> dict:
    """What the run trained on and how: its train config, steps, warm-up, variant, and what computed its states."""
    from eagle3 import checkpoint
    from eagle3.config import from_dict, renamed_keys
    from eagle3.extract.store_format import read_store_json, resolve_store_dir
    from eagle3.train.config import TrainConfig
    from eagle3.train.inputs import store_key_of

    layout = run_layout(run)
    ckpt_dir = checkpoint.latest_step_dir(layout.folder("checkpoint"))
    if ckpt_dir is None:
        raise SystemExit(f"{layout.folder('checkpoint')} holds no checkpoint: is {run} a finished eagle3_train run?")
    state_file = os.path.join(ckpt_dir, checkpoint.STATE_FILE)
    state = json.load(open(state_file))
    # a checkpoint written before the keys' rename: the config under the current names (eagle3.config.RENAMED)
    tc = renamed_keys(dict(state["train_config"]), TrainConfig.__dataclass_fields__, f"{state_file} train_config")
    steps = int(state["total_steps"])
    budget = state.get("budget") or {}
    warmup = int(budget.get("warmup") or max(1, round(tc["warmup_ratio"] * steps)))
    draft_cfg = json.load(open(os.path.join(ckpt_dir, checkpoint.CONFIG_FILE)))
    variant = draft_cfg.get("variant", "eagle3")
    store = None
    if tc.get("store") and not tc.get("online"):
        folder = resolve_store_dir(tc["store"], store_key_of(from_dict(TrainConfig, tc)))
        store = read_store_json(folder)
    # The engines that computed the trained samples' states (a re-run reuses what another engine stored).
    engines = json.load(open(layout.task_result("train"))).get("engines") or {}
    return {"layout": layout, "train_config": tc, "steps": steps, "warmup": warmup, "seed": int(tc["seed"]),
            "epoch": int(state["position"]["epoch"]), "draft_variant": variant,
            "parallel_drafting": bool(draft_cfg.get("parallel_drafting", False)), "store": store, "engines": engines,
            "target_engine": next(iter(engines)) if len(engines) == 1 else None, "budgeted": bool(budget.get("fixed"))}


def retrain_config(inputs: dict, vary: str, other: str, work: str) -> dict:
    """The run's train config with ``vary`` set to ``other``: same data, schedule and exactly its step count (fixed,
    not re-timed: the machine's load differs now). A time-budgeted run's curve (refit and re-plans included) is
    replayed from its checkpoint (TrainConfig.schedule_from); an epochs-based one is capped at its steps."""
    steps, warmup = inputs["steps"], inputs["warmup"]
    tc = dict(inputs["train_config"])
    tc.update(out=os.path.join(work, "checkpoint"), train_time_budget=0.0, train_deadline=0.0, max_steps=steps,
              epochs=inputs["epoch"] + 2, warmup_ratio=warmup / steps)
    if inputs["budgeted"]:
        tc["schedule_from"] = inputs["layout"].folder("checkpoint")
    if vary in ("draft_variant", "parallel_drafting", "seed"):
        tc[vary] = other
    elif tc.get("online"):  # the other engine serves the target while it trains; nothing is written back
        tc.update(target_engine=other, store=None, write_back=False)
    else:
        tc["store"] = os.path.join(work, "store")
    return {k: v for k, v in tc.items() if v is not None}


def extract_args(inputs: dict, engine: str, work: str) -> list[str]:
    """`eagle3 extract` of the run's merged data with ``engine``, the run store's layers, option and precision."""
    tc, store = inputs["train_config"], inputs["store"]
    if store is None:
        raise SystemExit("--vary target_engine needs a run that trained offline from a store")
    return ["extract", "--merged", tc["merged"], "--model", tc["model"], "--out", os.path.join(work, "store"),
            "--engine", engine, "--aux-layers", ",".join(str(i) for i in store["aux_layers"]),
            "--storage-option", store["storage_option"], "--precision", store["precision"]["name"]]


def reusable_report(run: str, prompts: str, limit: int, steps: int, max_new_tokens: int) -> dict | None:
    """The run's own vLLM report when it measured exactly this benchmark."""
    want = {"prompts_source": prompts, "num_prompts": limit, "steps": steps, "max_new_tokens": max_new_tokens}
    for name in (layout.engine_report("vllm"), layout.EVAL_REPORT):
        path = os.path.join(run_layout(run).folder("eval"), name)
        if not os.path.exists(path):
            continue
        report = json.load(open(path))
        if report.get("backend") == "vllm" and all(report.get(k) == want[k] for k in SAME_BENCHMARK):
            return report
    return None


def headline_counts(report: dict) -> list[tuple[str, dict]]:
    primary = report.get("primary_set")
    return [(r["id"], r["counts"]) for r in report["prompts"] if primary is None or r["set"] == primary]


def compare(base: dict, changed: dict, base_name: str, changed_name: str) -> dict:
    """τ of both, and the paired bootstrap of changed − base over the prompts both decoded."""
    from eagle3.acceptance import paired_agreement, tau_of

    a, b = headline_counts(changed), headline_counts(base)
    if [i for i, _ in a] != [i for i, _ in b]:
        raise SystemExit("the two evaluations measured different prompts; they cannot be paired")
    pair = paired_agreement([c for _, c in a], [c for _, c in b])
    return {"tau": {base_name: tau_of([c for _, c in b]), changed_name: tau_of([c for _, c in a])},
            "speedup": {base_name: base.get("speedup"), changed_name: changed.get("speedup")},
            "lossless": {base_name: base["lossless"], changed_name: changed["lossless"]},
            "same_greedy_output": sum(x.get("token_ids") == y.get("token_ids")
                                      for x, y in zip(changed["prompts"], base["prompts"])),
            "difference": pair["tau"], "by_position": pair["by_position"], "prompts": pair["prompts"]}


def paired(run: str, vary: str, work: str | None = None, prompts: str = "humaneval", limit: int = 5,
           steps: int = 3, max_new_tokens: int = 64, say=print) -> dict:
    """The whole bench; returns (and writes to WORKDIR/paired.json) the comparison."""
    if vary not in VARIES:
        raise SystemExit(f"--vary {vary!r}: choose one of {', '.join(VARIES)}")
    inputs = run_inputs(run)
    mine = inputs[vary]
    if mine is None:
        raise SystemExit(f"the run trained on states computed by several engines ({inputs['engines']}): "
                         "--vary target_engine pairs one engine's states against the other's")
    other = other_value(vary, mine)
    work = work or os.path.join(run, f"paired-{vary}")
    os.makedirs(work, exist_ok=True)
    seconds = {}
    if vary == "target_engine" and not inputs["train_config"].get("online"):
        say(f"extracting the run's data again with {other} (the run's store was written by {mine})")
        seconds["extract"] = run_stage(extract_args(inputs, other, work), os.path.join(work, "extract.log"))
    tc = retrain_config(inputs, vary, other, work)
    cfg_path = os.path.join(work, "train.json")
    json.dump(tc, open(cfg_path, "w"), indent=1)
    say(f"training with {vary}={other} for {inputs['steps']} steps (warm-up {inputs['warmup']}), as the run trained "
        f"with {vary}={mine}")
    seconds["train"] = run_stage(["train", "--config", cfg_path], os.path.join(work, "train.log"))
    draft = os.path.join(work, "draft")
    run_stage(["export", "--checkpoint", tc["out"], "--out", draft], os.path.join(work, "export.log"))
    bench = ["--prompts", prompts, "--limit", str(limit), "--max-new-tokens", str(max_new_tokens),
             "--steps", str(steps), "--backend", "vllm"]
    reports = {}
    for name, d in ((label(vary, mine), inputs["layout"].folder("draft")), (label(vary, other), draft)):
        reused = reusable_report(run, prompts, limit, steps, max_new_tokens) if name == label(vary, mine) else None
        if reused is not None:
            say(f"{vary}={name}: the run's own vLLM evaluation is reused (same prompts and settings)")
            reports[name] = reused
            continue
        out = os.path.join(work, f"eval-{name}")
        say(f"evaluating {vary}={name} in vLLM")
        seconds[f"evaluate {name}"] = run_stage(["evaluate", "--model", tc["model"], "--draft", d, "--out", out]
                                                + bench, os.path.join(work, f"evaluate-{name}.log"))
        reports[name] = json.load(open(os.path.join(out, layout.EVAL_REPORT)))
    result = {"run": run, "vary": vary, "engines": inputs["engines"], "base": mine, "changed": other,
              "steps": inputs["steps"], "warmup": inputs["warmup"], "benchmark": {"prompts": prompts, "limit": limit, "steps": steps,
                                                         "max_new_tokens": max_new_tokens, "engine": "vllm"},
              **compare(reports[label(vary, mine)], reports[label(vary, other)], label(vary, mine),
                        label(vary, other)),
              "seconds": {k: round(v, 1) for k, v in seconds.items()}}
    with open(os.path.join(work, "paired.json"), "w") as f:
        json.dump(result, f, indent=1)
    say(summary_line(result))
    return result


def summary_line(r: dict) -> str:
    d, base, changed = r["difference"], label(r["vary"], r["base"]), label(r["vary"], r["changed"])
    iv = d["interval"]
    speed = r.get("speedup") or {}
    speeds = (f"; speed-up over the target alone {base} {speed[base]:.2f}x, {changed} {speed[changed]:.2f}x"
              if speed.get(base) and speed.get(changed) else "")
    return (f"{r['vary']}, vLLM, {r['benchmark']['prompts']} x {r['prompts']}, k={r['benchmark']['steps']}, "
            f"{r['steps']} steps each: tau {base} {r['tau'][base]:.3f}, {changed} "
            f"{r['tau'][changed]:.3f}; {changed} - {base} = {d['difference']:+.3f} "
            f"(95% paired interval [{iv[0]:+.3f}, {iv[1]:+.3f}]: "
            f"{'no difference the prompts can show' if d['agree'] else 'a difference'}){speeds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a finished eagle3_train run folder")
    ap.add_argument("--vary", required=True, choices=VARIES)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    paired(args.run, args.vary, args.workdir, args.prompts, args.limit, args.steps, args.max_new_tokens)


if __name__ == "__main__":
    main()
