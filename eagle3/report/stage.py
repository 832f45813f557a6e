"""The report stage: report.json, PNG plots, a self-contained report.html, and run_summary.json.

    report(ReportConfig(root, dag_id, run_id))        # a DAG run (eagle3.layout): writes RUN/report/
    write_report(out, prepared=..., checkpoint=..., evaluation=..., ...)   # explicit paths

report.json is eagle3.report.collect's content of the run (what the UI's report tab shows too) plus the plots.
Every input is optional; a plot whose input is missing is left out and named under "missing":

- datasets: RUN/stats/stats_table.json (else PREP/<dataset>/stats.json or MERGED/manifest.json)
  -> token share vs sample share;
- training: CKPT/metrics.jsonl -> loss_i and acc_i per TTT step over steps;
- evaluation: EVAL/report.json -> acceptance rate by position, τ and tok/s;
- comparison: EVAL/publish.json (the gate's decision and the previous best draft)
  and the offline simulated τ; EVAL/sglang_report.json when the SGLang benchmark ran.
"""

from __future__ import annotations

import io
import logging
import time
from typing import Any

from eagle3 import layout, storage
from eagle3.acceptance import ordered_sets
from eagle3.layout import RUN_SUMMARY_SCHEMA, RunLayout

log = logging.getLogger(__name__)

PLOTS = ("datasets.png", "training.png", "acceptance.png", "comparison.png")


# -- plots ------------------------------------------------------------------------------

def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def plot_datasets(rows: list[dict]) -> bytes:
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows) + 2), 3.6))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["sample_share"] for r in rows], 0.4, label="share of samples")
    ax.bar(x + 0.2, [r["token_share"] for r in rows], 0.4, label="share of tokens")
    ax.set_xticks(x, [r["dataset"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("share")
    ax.set_title("Token share vs sample share per dataset")
    ax.legend()
    return _png(fig)


def plot_training(curves: dict) -> bytes:
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(11, 3.8))
    for kind, style in (("train", "-"), ("eval", "o--")):
        events = [e for e in curves[kind] if e["step"] is not None]
        n = max((len(e["loss_i"]) for e in events), default=0)
        for i in range(n):
            steps = [e["step"] for e in events if i < len(e["loss_i"]) and e["loss_i"][i] is not None]
            ax_l.plot(steps, [e["loss_i"][i] for e in events if i < len(e["loss_i"]) and e["loss_i"][i] is not None],
                      style, color=f"C{i}", label=f"{kind} step {i}", markersize=3)
            steps = [e["step"] for e in events if i < len(e["acc_i"]) and e["acc_i"][i] is not None]
            ax_a.plot(steps, [e["acc_i"][i] for e in events if i < len(e["acc_i"]) and e["acc_i"][i] is not None],
                      style, color=f"C{i}", label=f"{kind} step {i}", markersize=3)
    ax_l.set(title="loss_i per TTT step", xlabel="optimizer step", ylabel="soft CE")
    ax_a.set(title="acc_i per TTT step", xlabel="optimizer step", ylabel="top-1 agreement", ylim=(0, 1))
    ax_a.legend(fontsize=6, ncol=2)
    return _png(fig)


def plot_acceptance(rates: list | dict[str, list]) -> bytes:
    """Bars of P(accepted | reached) by draft position; one group member per prompt set."""
    import matplotlib.pyplot as plt

    by_set = rates if isinstance(rates, dict) else {"": rates}
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    n = max(len(r) for r in by_set.values())
    pos = list(range(1, n + 1))
    width = 0.8 / len(by_set)
    for j, (name, r) in enumerate(by_set.items()):
        xs = [p - 0.4 + width * (j + 0.5) for p in pos[: len(r)]]
        ax.bar(xs, [v if v is not None else 0 for v in r], width=width, color=f"C{j + 2}", label=name or None)
        for x, v in zip(xs, r):
            ax.text(x, (v or 0) + 0.02, "n/a" if v is None else f"{v:.2f}", ha="center", fontsize=7)
    if len(by_set) > 1:
        ax.legend(fontsize=8, loc="upper right")
    ax.set(title="Acceptance rate by draft position", xlabel="draft position i",
           ylabel="P(accepted | reached)", ylim=(0, 1.15), xticks=pos)
    return _png(fig)


def plot_comparison(cmp: dict) -> bytes:
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(10, 3.6))
    taus = [(k, v) for k, v in (("this draft", cmp.get("tau")), ("offline sim.", cmp.get("sim_tau")),
                                ("previous best", cmp.get("previous_tau")), ("SGLang", cmp.get("sglang_tau")),
                                ("vLLM", cmp.get("vllm_tau")))
            if v is not None]
    ax_t.bar([k for k, _ in taus], [v for _, v in taus], color=[f"C{i}" for i in range(len(taus))])
    ax_t.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax_t.set(title=f"Acceptance length τ (k={cmp.get('steps')}, max {cmp.get('steps', 0) + 1})", ylabel="τ")
    speeds = [(k, v) for k, v in (("baseline", cmp.get("base_tps")), ("speculative", cmp.get("spec_tps")),
                                  ("prev. best spec.", cmp.get("previous_spec_tps"))) if v is not None]
    ax_s.bar([k for k, _ in speeds], [v for _, v in speeds], color=[f"C{i}" for i in range(len(speeds))])
    ax_s.set(title="Decoding speed", ylabel="tokens/s")
    for ax, items in ((ax_t, taus), (ax_s, speeds)):
        for i, (_, v) in enumerate(items):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    return _png(fig)


# -- the report -------------------------------------------------------------------------

def write_report(out: str, *, prepared: str | None = None, stats_dir: str | None = None, merged: str | None = None,
                 checkpoint: str | None = None, evaluation: str | None = None, title: str = "EAGLE-3 run report",
                 status: dict | None = None) -> dict[str, Any]:
    """Write out/report.json, the PNGs and out/report.html from whatever inputs exist; returns report.json.
    ``status``: the run's task outcome (eagle3.report.summary.run_status), shown first."""
    paths = {"prepared": prepared, "stats": stats_dir, "merged": merged, "checkpoint": checkpoint, "eval": evaluation}
    return _write(out, paths, title=title, status=status)


def _write(out: str, paths: dict[str, str | None], *, title: str, status: dict | None = None,
           results: dict | None = None, task_states: dict[str, str] | None = None) -> dict[str, Any]:
    """report.json = eagle3.report.collect's content of ``paths`` + title, plots, what could not be plotted, and
    the figures the comparison plot shows; then the PNGs and report.html (eagle3.report.html)."""
    import matplotlib

    from eagle3.report.collect import collect, training_curves
    from eagle3.report.html import render_html

    matplotlib.use("Agg")
    content = collect(paths, results, status)
    missing, plots = [], {}
    datasets, ev, acc = content["datasets"], content["evaluate"], content["acceptance"] or {}
    if datasets:
        plots["datasets.png"] = plot_datasets(datasets["rows"])
    else:
        missing.append("dataset statistics (no stats_table.json, PREP/*/stats.json or merged manifest)")
    curves = training_curves(paths.get("checkpoint"))
    if curves:
        plots["training.png"] = plot_training(curves)
    else:
        missing.append("training curves (no CKPT/metrics.jsonl)")
    if ev and ev.get("accept_rate_by_position"):
        plots["acceptance.png"] = plot_acceptance({n: s["accept_rate_by_position"] for n, s in ordered_sets(ev)})
    if not ev:
        missing.append("evaluation (no EVAL/report.json)")
    if not content["publish"]:
        missing.append("publish decision (no EVAL/publish.json)")
    prev = acc.get("previous") or {}
    comparison = {
        "tau": acc.get("tau"), "steps": acc.get("steps"), "sim_tau": acc.get("sim_accept_len"),
        "previous_tau": prev.get("acceptance_length"), "previous_spec_tps": prev.get("tokens_per_s_spec"),
        "base_tps": acc.get("tokens_per_s_base"), "spec_tps": acc.get("tokens_per_s_spec"),
        "sglang_tau": (content["sglang"] or {}).get("acceptance_length"),
        "vllm_tau": (((ev or {}).get("engines") or {}).get("vllm") or {}).get("tau"),
    }
    if ev:
        plots["comparison.png"] = plot_comparison(comparison)
    report = {
        "title": title, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "inputs": dict(paths),
        **content, "acceptance_length": acc.get("tau"), "lossless": acc.get("lossless"),
        "comparison": comparison, "plots": sorted(plots), "missing": missing,
    }
    for name, png in plots.items():
        storage.write_bytes(storage.join(out, name), png)
    storage.write_json(storage.join(out, layout.RUN_REPORT), report)
    storage.write_text(storage.join(out, "report.html"), render_html(report, plots, task_states))
    log.info("report: %s (%d plots; missing: %s)", out, len(plots), "; ".join(missing) or "nothing")
    return report


def _runs(root: str, dag_id: str) -> list[str]:
    """The run ids that have a folder under ``root`` for ``dag_id`` (newest names last)."""
    from eagle3.layout import runs

    return sorted({name.split("/", 1)[0] for name in storage.list_files(runs(root, dag_id))})


def run(cfg) -> dict[str, Any]:
    """The run's report folder from the layout's stage outputs, and run_summary.json (RUN_SUMMARY_SCHEMA)."""
    from eagle3.report import failures
    from eagle3.report.collect import task_results, task_state_map
    from eagle3.report.summary import run_status

    layout = RunLayout(cfg.root, cfg.dag_id, cfg.run_id)
    paths = layout.paths()
    if not storage.list_files(layout.dir):  # a typo in root, dag id or run id reads as an empty run
        log.warning("%s holds nothing of a run: the report will be empty; check --root, --dag-id and --run-id "
                    "(runs there: %s)", layout.dir, ", ".join(_runs(cfg.root, cfg.dag_id)[:5]) or "none")
    states = None if cfg.task_states is None else list(cfg.task_states)
    status = run_status(states, failures.read(layout))
    tasks = task_results(layout.summaries)
    report = _write(paths["report"], paths, title=f"EAGLE-3 run report: {cfg.dag_id} / {cfg.run_id}", status=status,
                    results=tasks, task_states=task_state_map(states))
    reuse = report["reuse"]
    storage.write_json(storage.join(paths["report"], "reuse.json"), reuse)
    result = {"out": paths["report"], "plots": report["plots"], "missing": report["missing"],
              "acceptance_length": report["acceptance_length"], "lossless": report["lossless"], "reuse": reuse,
              "failed": [f["task"] for f in status["failed"]]}
    storage.write_json(layout.summary_file, {
        "schema": RUN_SUMMARY_SCHEMA, "dag_id": cfg.dag_id, "run_id": cfg.run_id, "root": cfg.root,
        "paths": paths, "tasks": tasks, "reused": reuse, "report": result, "status": status})
    log.info("report: %s; reused: %s", paths["report"], reuse)
    return result
