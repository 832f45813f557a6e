"""`make demo`: the whole eagle3_train DAG on the bundled SmolLM2-135M-Instruct.

Writes the demo corpus, runs `airflow dags test eagle3_train` with the demo
settings (embedded SQLite Airflow), then prints the stats table, the gate
verdict, τ, the speedup, the lossless verdict and where the report is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "eagle3_train"

# Sized for 15 minutes on 2 CPU cores; see README "The demo".
DEMO_CONF = {
    "model": "smollm2-135m-instruct",
    "drop": ["long_reports"],  # the dataset the stats flag: 6% of the samples, 25% of the tokens
    "max_seq_len": 1024,
    "draft_vocab_size": 2048,
    "ttt_length": 3,
    "epochs": 3,
    "lr": 2e-3,
    "extract_token_budget": 1024,
    "train_token_budget": 1024,
    "extract_shards": 2,
    "extract_tokens_per_s": 750,  # measured here: SmolLM2 fp32 on 2 CPU cores, one shard at a time
    "train_tokens_per_s": 900,  # measured here: this draft (TTT 3, Vd 2048) fp32 on 2 CPU cores
    "benchmark_prompts": "humaneval,chat",
    "benchmark_limit": 5,
    "max_new_tokens": 64,
    "steps": 3,
    "evaluate_compare_with": ["vllm"],  # the project decoder and vLLM on the same prompts (README "vLLM")
    "regenerate_backend": "openai",
    "regenerate_server": "vllm",  # each regenerate task serves SmolLM2 in vLLM: 182 vs 58 tok/s of hf here
    "regenerate_max_tokens": 128,
    "regenerate_concurrency": 48,
}
DEMO_SCALE = 0.15
REGENERATED = "coding,code_completion"  # answers replaced by SmolLM2's own before tokenizing (chat: not in 15 min)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    ap.add_argument("--scale", type=float, default=DEMO_SCALE, help="demo corpus size multiplier")
    ap.add_argument("--conf", default="{}", help="JSON overriding the demo DAG-run conf")
    ap.add_argument("--model", default=DEMO_CONF["model"],
                    help="target: an alias of eagle3.target.ALIASES (smollm2-135m-instruct, gemma3-270m) or a "
                         "model directory; the DAG's `model` param (regenerate, tokenize, extract, train, evaluate)")
    args = ap.parse_args()

    artifacts = Path(args.artifacts).resolve()
    demo_dir = artifacts / "demo"
    env = {**os.environ, "EAGLE3_ARTIFACTS": str(artifacts), "PYTHONPATH": str(REPO),
           "EAGLE3_MANIFEST": str(demo_dir / "manifest.yaml"), "EAGLE3_RETRY_DELAY_S": "5",
           "EAGLE3_OOM_RETRY_DELAY_S": "2"}
    bin_dir = Path(sys.executable).parent
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "eagle3.cli", "demo-data", "--out", str(demo_dir),
                    "--scale", str(args.scale), "--regenerate", REGENERATED], check=True, env=env)
    conf = {**DEMO_CONF, "model": args.model, "manifest": str(demo_dir / "manifest.yaml"),
            "storage_root": str(artifacts), **json.loads(args.conf)}
    conf = {k: v for k, v in conf.items() if v is not None}
    log_path = demo_dir / "dags_test.log"
    print(f"running `airflow dags test eagle3_train` (full log: {log_path})", flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(bin_dir / "airflow"), "dags", "test", DAG_ID, "-c", json.dumps(conf)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if any(k in line for k in ("[DAG TEST] running task", "ETA", "done in", "Marking task as", "ERROR", "Traceback",
                                       "error:", "τ", "acceptance")):
                print(line.rstrip()[:300], flush=True)
        code = proc.wait()
    minutes = (time.time() - t0) / 60
    print(f"\n=== demo finished in {minutes:.1f} min (airflow dags test exit {code}) ===")
    return summarize(artifacts) or code


def summarize(artifacts: Path) -> int:
    from eagle3.layout import RunLayout, runs

    found = sorted(Path(runs(str(artifacts), DAG_ID)).glob("*"), key=lambda p: p.stat().st_mtime)
    if not found:
        print("no run folder found")
        return 1
    run = {k: Path(v) for k, v in RunLayout(str(artifacts), DAG_ID, found[-1].name).paths().items()}
    table = run["stats"] / "stats_table.txt"
    if table.exists():
        print("\n--- dataset statistics ---\n" + table.read_text())
    verify = run["merged"] / "verify.json"
    if verify.exists():
        v = json.loads(verify.read_text())
        print(f"--- verify gate: {'PASSED' if v['passed'] else 'FAILED'} "
              f"({sum(c['passed'] for c in v['checks'])}/{len(v['checks'])} checks) ---")
    report = run["eval"] / "report.json"
    if report.exists():
        r = json.loads(report.read_text())
        sim = r.get("sim_accept_len_k")
        from eagle3.acceptance import ordered_sets

        for name, s in ordered_sets(r):
            print(f"--- evaluation on {name} ({s.get('num_prompts', '?')} prompts x {r.get('max_new_tokens')} "
                  f"tokens, k={r.get('steps')} draft steps) ---")
            print(f"acceptance length tau = {s['acceptance_length']:.3f}")
            rates = ", ".join("-" if a is None else f"{a:.2f}" for a in s.get("accept_rate_by_position", []))
            print(f"acceptance rate by draft position: {rates}")
            print(f"speedup = {s.get('speedup', 0):.2f}x   ({s.get('tokens_per_s_spec', 0):.1f} vs "
                  f"{s.get('tokens_per_s_base', 0):.1f} tok/s)")
        if sim:
            print(f"trainer's offline estimate on its held-out split: tau {sim:.3f}")
        print(f"lossless (every prompt of every set) = {r['lossless']}")
        _print_engines(r)
    html = run["report"] / "report.html"
    print(f"report: {html if html.exists() else run['report']}")
    return 0 if report.exists() else 1


def _print_engines(r: dict) -> None:
    """The draft on the project decoder and on vLLM, side by side (report.json `engines`, `agreement`)."""
    engines = r.get("engines") or {}
    if len(engines) < 2:
        return

    def ci(point, iv) -> str:
        return "-" if point is None else f"{point:.3f}" + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "")

    print(f"--- engines side by side on {r.get('primary_set')} (95% bootstrap intervals over prompts) ---")
    for name in r.get("engine_order") or engines:
        e = engines[name]
        rates = ", ".join(ci(a, iv) for a, iv in zip(e["accept_rate_by_position"], e["rate_intervals"]))
        start = e.get("server_start_s")
        print(f"{name:>12}: tau {ci(e['tau'], e['tau_interval'])}; by position {rates}; "
              f"{e['tokens_per_s_spec']:.1f} vs {e['tokens_per_s_base']:.1f} tok/s; lossless={e['lossless']}"
              + (f"; server starts {start['baseline']:.0f} s + {start['eagle3']:.0f} s" if start else ""))
    for name, a in (r.get("agreement") or {}).items():
        print(f"{name} vs {a['against']}: {'agree' if a['agree'] else 'DISAGREE beyond the intervals'} "
              f"(tau difference {a['tau']['difference']:+.3f}, interval {a['tau']['interval']})")


if __name__ == "__main__":
    sys.exit(main())
