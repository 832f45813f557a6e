"""`make demo`: the whole eagle3_train DAG on the bundled SmolLM2-135M-Instruct.

Writes the demo corpus, runs `airflow dags test eagle3_train` with the demo settings
(eagle3/demo/settings.py, which are also the DAG Params' defaults; embedded SQLite Airflow), then
prints what happened: first every task that failed with the first lines of its error, then the stats
table, the gate verdict, τ, the speedup and the lossless verdict of each engine, and where the report
is. Exits non-zero when any task failed. `--data-only` writes the corpus and stops (`make airflow`).
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
if str(REPO) not in sys.path:  # `python demo/run_demo.py` from a fresh shell, as the Makefile runs it
    sys.path.insert(0, str(REPO))

from bench.paired_bench import VARIES, paired  # noqa: E402
from eagle3.demo import settings  # noqa: E402 (after the path)
from eagle3.layout import ROOT_ENV  # noqa: E402

DAG_ID = "eagle3_train"
SHOWN = ("[DAG TEST] running task", "ETA", "done in", "Marking task as", "ERROR", "Traceback", "error:", "τ",
         "acceptance")


def more_data(mode: str, precision=None, bf16_gflops=...) -> tuple[dict[str, float], str]:
    """The `demo-data --more` factors and why: when ``mode`` is auto and the machine's precision policy
    (``precision``, else resolved here for the default device) picks bf16, settings.MORE_ON_BF16 sized by
    `settings.more_factors` to the CPU's bf16 rate (``bf16_gflops``, else the policy's cached probe; None on a
    GPU); none for off."""
    if mode == "off":
        return {}, "--more-data off"
    from eagle3.devices import cpu_probe, resolve_device, resolve_precision

    device = resolve_device("auto")
    if precision is None:
        precision = resolve_precision("auto", device)
    if not precision.bf16:
        return {}, f"this machine computes in fp32 ({precision.reason})"
    if bf16_gflops is ...:
        probe = cpu_probe() if device == "cpu" else None
        bf16_gflops = probe["bfloat16"] if probe else None
    more = settings.more_factors(bf16_gflops)
    rate = "" if bf16_gflops is None else (f"; bf16 at {bf16_gflops:.0f} GFLOP/s buys one more copy per "
                                           f"{settings.MORE_GFLOPS_PER_X:.0f}")
    return more, f"this machine computes in bf16 ({precision.reason}{rate})"


def write_corpus(artifacts: Path, scale: float, env: dict, more: dict[str, float]) -> Path:
    """The demo corpus under <artifacts>/demo (eagle3.demo.settings); returns its manifest."""
    manifest = Path(settings.manifest_path(str(artifacts)))
    extra = [a for k, v in sorted(more.items()) for a in ("--more", f"{k}={v:g}")]
    subprocess.run([sys.executable, "-m", "eagle3.cli", "demo-data", "--out", str(manifest.parent),
                    "--scale", str(scale), "--regenerate", ",".join(settings.REGENERATED), *extra],
                   check=True, env=env)
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--artifacts", default=os.environ.get(ROOT_ENV) or str(REPO / "artifacts"))
    ap.add_argument("--scale", type=float, default=settings.SCALE, help="demo corpus size multiplier")
    ap.add_argument("--conf", default="{}", help="JSON overriding the DAG Params' defaults (the demo settings)")
    ap.add_argument("--model", default=settings.PARAMS["model"],
                    help="target: an alias of eagle3.target.ALIASES (smollm2-135m-instruct, gemma3-270m) or a "
                         "model directory; the DAG's `model` param (regenerate, tokenize, extract, train, evaluate)")
    ap.add_argument("--data-only", action="store_true", help="write the demo corpus (if missing) and stop")
    ap.add_argument("--more-data", choices=("auto", "off"), default="auto",
                    help="auto: more samples of the datasets in eagle3.demo.settings.MORE_ON_BF16 where the "
                         "precision policy picks bf16, sized to the CPU's measured bf16 rate (more_factors); off: "
                         "the same corpus on every machine")
    ap.add_argument("--compare", default=",".join(settings.COMPARE),
                    help="after the run, train its draft again with one setting changed for the same steps and "
                         "pair both in vLLM (bench/paired_bench.py): a comma-separated list of "
                         f"{', '.join(VARIES)}; target_engine is added when the conf sets a non-default engine")
    args = ap.parse_args()
    compare = [v.strip() for v in args.compare.split(",") if v.strip()]
    if json.loads(args.conf).get("target_engine", "transformers") != "transformers":
        # a non-default engine is reported next to the default one's, and both against training noise
        compare += [v for v in ("target_engine", "seed") if v not in compare]
    wrong = [v for v in compare if v not in VARIES]
    if wrong:
        ap.error(f"--compare {','.join(wrong)}: choose from {', '.join(VARIES)}")

    artifacts = Path(args.artifacts).resolve()
    env = {**os.environ, ROOT_ENV: str(artifacts),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           settings.MANIFEST_ENV: settings.manifest_path(str(artifacts)), "EAGLE3_RETRY_DELAY_S": "5",
           "EAGLE3_OOM_RETRY_DELAY_S": "2"}
    more, why = more_data(args.more_data)
    print("demo corpus: " + (", ".join(f"{k} x{v:g}" for k, v in more.items()) or "plain") + f": {why}",
          flush=True)
    if args.data_only:
        if not Path(settings.manifest_path(str(artifacts))).exists():
            write_corpus(artifacts, args.scale, env, more)
        print(f"demo manifest: {settings.manifest_path(str(artifacts))}")
        return 0
    t0 = time.time()
    manifest = write_corpus(artifacts, args.scale, env, more)
    # Everything else is the DAG Params' defaults, which are the demo settings.
    conf = {"model": args.model, "manifest": str(manifest), "storage_root": str(artifacts), **json.loads(args.conf)}
    conf = {k: v for k, v in conf.items() if v is not None}
    log_path = manifest.parent / "dags_test.log"
    print(f"running `airflow dags test eagle3_train` (full log: {log_path})", flush=True)
    bin_dir = Path(sys.executable).parent
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(bin_dir / "airflow"), "dags", "test", DAG_ID, "-c", json.dumps(conf)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if any(k in line for k in SHOWN):
                print(line.rstrip()[:300], flush=True)
        code = proc.wait()
    minutes = (time.time() - t0) / 60
    run_dir = newest_run(artifacts)
    failed, not_run = failures(run_dir, env, bin_dir) if run_dir else ([("the run", ["no run folder"])], [])
    if failed or code:
        head = ", ".join(name for name, _ in failed) or f"airflow dags test exit {code}"
        print(f"\n=== demo FAILED in {minutes:.1f} min: {head} ===")
        for name, lines in failed:
            print(f"{name} failed:" + "".join(f"\n    {ln}" for ln in lines[:5]))
        if not_run:
            print("did not run (an upstream task failed): " + ", ".join(not_run))
        print(f"(full log: {log_path})")
    else:
        print(f"\n=== demo finished in {minutes:.1f} min: every task succeeded or was skipped ===")
    if run_dir:
        summarize(run_dir)
    if run_dir and compare and not (failed or code):
        results = {}
        try:
            for vary in compare:
                print(f"\n--- paired comparison: {vary} (bench/paired_bench.py) ---", flush=True)
                results[vary] = paired(str(run_dir), vary, say=lambda line: print(line, flush=True))
        except SystemExit as e:  # a stage of the comparison failed: the demo did not do what it said
            print(f"paired comparison failed: {e}")
            return 1
        for line in against_noise(results):
            print(line)
        print(f"demo with comparisons: {(time.time() - t0) / 60:.1f} min in all")
    return 1 if failed or code else 0


def against_noise(results: dict) -> list[str]:
    """Each setting's τ difference next to the seed's: the paired interval covers the prompts, not training noise,
    so a difference no larger than two seeds' is not shown to be the setting's doing (one seed pair is a rough
    yardstick, and the line says so)."""
    if "seed" not in results:
        return []
    noise = abs(results["seed"]["difference"]["difference"])
    out = []
    for vary, r in results.items():
        if vary != "seed":
            d = r["difference"]["difference"]
            out.append(f"{vary}: tau difference {d:+.3f}; two seeds of the run's own settings differ by {noise:.3f}, "
                       + ("so it is within training noise" if abs(d) <= noise + 1e-9 else
                          "so it is larger than that one seed pair's difference (a rough yardstick: one pair)"))
    return out


def newest_run(artifacts: Path) -> Path | None:
    from eagle3.layout import runs

    found = sorted(Path(runs(str(artifacts), DAG_ID)).glob("*"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def task_states(run_id: str, env: dict, bin_dir: Path) -> list[dict] | None:
    """[{"task_id", "map_index", "state"}] of the run, from Airflow (None if it cannot tell)."""
    out = subprocess.run([str(bin_dir / "airflow"), "tasks", "states-for-dag-run", DAG_ID, run_id, "-o", "json"],
                         env=env, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[{") or ln.strip() == "[]"]
    try:
        rows = json.loads(lines[-1])
    except (IndexError, ValueError):
        return None
    # the CLI prints an unmapped task's map_index as ""
    return [{"task_id": r["task_id"], "map_index": int(r["map_index"]) if str(r.get("map_index", "")).lstrip(
        "-").isdigit() else -1, "state": r.get("state")} for r in rows]


def failures(run_dir: Path, env: dict, bin_dir: Path) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """([(task, first lines of its error)] of every failed task but outcome, [tasks that did not run])."""
    from eagle3.layout import RunLayout
    from eagle3.report import failures as kept
    from eagle3.report.summary import run_status

    layout = RunLayout(str(run_dir.parents[2]), DAG_ID, run_dir.name)
    status = run_status(task_states(run_dir.name, env, bin_dir), kept.read(layout))
    out = [(f["task"], [f"{f['error']}: {f['lines'][0]}", *f["lines"][1:]] if f["lines"] else
            ["(no error kept in the run folder: see the log)"]) for f in status["failed"]]
    return out, status["not_run"]


def _num(v, digits: int) -> str:
    """A figure as printed; "-" where the report has none (an engine that measured only some)."""
    return "-" if v is None else f"{v:.{digits}f}"


def summarize(run_dir: Path) -> None:
    from eagle3.layout import EVAL_REPORT, VERIFY_RESULT, RunLayout
    from eagle3.report.summary import headline_rows, lossless_text, tie_flips, vocab_reach_text

    run = {k: Path(v) for k, v in RunLayout(str(run_dir.parents[2]), DAG_ID, run_dir.name).paths().items()}
    table = run["stats"] / "stats_table.txt"
    if table.exists():
        print("\n--- dataset statistics ---\n" + table.read_text())
    verify = run["merged"] / VERIFY_RESULT
    if verify.exists():
        v = json.loads(verify.read_text())
        print(f"--- verify gate: {'PASSED' if v['passed'] else 'FAILED'} "
              f"({sum(c['passed'] for c in v['checks'])}/{len(v['checks'])} checks) ---")
    report = run["eval"] / EVAL_REPORT
    if report.exists():
        r = json.loads(report.read_text())
        rows = headline_rows(r)
        print(f"--- evaluation ({r.get('max_new_tokens')} new tokens per prompt, k={r.get('steps')} draft steps; "
              "each engine's speedup is its speculative over its own baseline tok/s) ---")
        for row in rows:
            rates = ", ".join("-" if a is None else f"{a:.2f}" for a in row["rates"])
            iv = row.get("tau_interval")
            print(f"{row['engine_label']} on {row['set']} ({row['prompts']} prompts): tau {_num(row['tau'], 3)}"
                  + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "") + f"; acceptance by position {rates}; "
                  f"{_num(row['tokens_per_s_spec'], 1)} vs {_num(row['tokens_per_s_base'], 1)} tok/s = "
                  f"{_num(row['speedup'], 2)}x; lossless: {row['lossless_text']}")
        if reach := vocab_reach_text(r):
            print(reach)
        sim = r.get("sim_accept_len_k")
        if sim:
            print(f"trainer's offline estimate on its held-out split: tau {sim:.3f}")
        for f in tie_flips(r):
            print(f"  tie flip ({f['engine']}, {f['precision']}): {f['id']} at generated position {f['position']}, "
                  f"fp32 margin {f['margin_fp32']:+.4f} within the measured rounding {f['tolerance']:.4f}")
        print(f"lossless, every engine and prompt set: {lossless_text(r)}")
        for name, a in (r.get("agreement") or {}).items():
            print(f"{name} vs {a['against']}: {'agree' if a['agree'] else 'DISAGREE beyond the intervals'} "
                  f"(tau difference {a['tau']['difference']:+.3f}, interval "
                  f"[{', '.join(f'{x:+.3f}' for x in a['tau']['interval'])}], "
                  f"on {a.get('compared_on', 'all prompts')}; same greedy output on {a.get('same_greedy_output')} "
                  f"of {a.get('prompts_compared')} prompts)")
    html = run["report"] / "report.html"
    print(f"report: {html if html.exists() else run['report']}")


if __name__ == "__main__":
    sys.exit(main())
