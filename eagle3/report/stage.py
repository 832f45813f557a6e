"""The report stage: report.json, PNG plots, a self-contained report.html, and run_summary.json.

    report(ReportConfig(root, dag_id, run_id))        # a DAG run (eagle3.layout): writes RUN/report/
    write_report(out, prepared=..., checkpoint=..., evaluation=..., ...)   # explicit paths

Every input is optional; a missing part becomes a line under "missing" and
its plot is left out (a run without regeneration, a failed evaluation, ...):

- datasets: PREP/<dataset>/stats.json (samples, tokens) -> token share vs sample
  share (falls back to RUN/stats/stats_table.json or MERGED/manifest.json);
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

from eagle3 import storage
from eagle3.acceptance import ordered_sets
from eagle3.layout import RUN_SUMMARY_SCHEMA, RunLayout

log = logging.getLogger(__name__)

PLOTS = ("datasets.png", "training.png", "acceptance.png", "comparison.png")


def _json(uri: str | None) -> Any:
    if not uri:
        return None
    try:
        return storage.read_json(uri) if storage.exists(uri) else None
    except (OSError, ValueError) as e:
        log.warning("report: could not read %s (%s); that part is left out", uri, e)
        return None


def dataset_rows(prepared: str | None = None, stats_dir: str | None = None,
                 merged: str | None = None) -> tuple[list[dict], str | None]:
    """[{dataset, samples, tokens, sample_share, token_share}] and where they came from."""
    rows, origin = [], None
    if prepared:
        for name in storage.list_files(prepared):
            if name.count("/") == 1 and name.endswith("/stats.json"):
                doc = _json(storage.join(prepared, name)) or {}
                if "samples" in doc and "tokens" in doc:
                    rows.append({"dataset": doc.get("dataset", name.split("/")[0]),
                                 "samples": int(doc["samples"]), "tokens": int(doc["tokens"])})
        origin = storage.join(prepared, "*/stats.json") if rows else None
    if not rows and stats_dir:
        table = _json(storage.join(stats_dir, "stats_table.json")) or {}
        rows = [{"dataset": r["dataset"], "samples": int(r["samples"]), "tokens": int(r["tokens"])}
                for r in table.get("datasets", []) if "samples" in r and "tokens" in r]
        origin = storage.join(stats_dir, "stats_table.json") if rows else None
    if not rows and merged:
        manifest = _json(storage.join(merged, "manifest.json")) or {}
        rows = [{"dataset": k, "samples": int(v.get("samples_out", 0)), "tokens": int(v.get("tokens_out", 0))}
                for k, v in (manifest.get("sources") or {}).items()]
        origin = storage.join(merged, "manifest.json") if rows else None
    total_s = sum(r["samples"] for r in rows) or 1
    total_t = sum(r["tokens"] for r in rows) or 1
    for r in rows:
        r["sample_share"], r["token_share"] = r["samples"] / total_s, r["tokens"] / total_t
    return sorted(rows, key=lambda r: r["dataset"]), origin


def training_curves(checkpoint: str | None) -> dict | None:
    """{"train": [...], "eval": [...]} events of CKPT/metrics.jsonl (eagle3.checkpoint's schema)."""
    from eagle3.checkpoint import METRICS_FILE, read_metrics

    if not checkpoint:
        return None
    try:
        events = read_metrics(storage.join(checkpoint, METRICS_FILE))
    except (OSError, ValueError) as e:
        log.warning("report: could not read the metrics of %s (%s); training curves are left out", checkpoint, e)
        return None
    out: dict[str, list[dict]] = {"train": [], "eval": []}
    for ev in events:
        if ev.get("event") in out:
            out[ev["event"]].append({k: ev.get(k) for k in ("step", "loss_i", "acc_i", "sim_accept_len")})
    return out if out["train"] or out["eval"] else None


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
    import matplotlib

    from eagle3.report.summary import headline_rows

    matplotlib.use("Agg")
    missing, plots = [], {}
    rows, rows_origin = dataset_rows(prepared, stats_dir, merged)
    if rows:
        plots["datasets.png"] = plot_datasets(rows)
    else:
        missing.append("dataset statistics (no PREP/*/stats.json, stats_table.json or merged manifest)")
    curves = training_curves(checkpoint)
    if curves:
        plots["training.png"] = plot_training(curves)
    else:
        missing.append("training curves (no CKPT/metrics.jsonl)")
    ev = _json(storage.join(evaluation, "report.json")) if evaluation else None
    decision = _json(storage.join(evaluation, "publish.json")) if evaluation else None
    sglang = _json(storage.join(evaluation, "sglang_report.json")) if evaluation else None
    if ev and ev.get("accept_rate_by_position"):
        plots["acceptance.png"] = plot_acceptance({n: s["accept_rate_by_position"] for n, s in ordered_sets(ev)})
    if not ev:
        missing.append("evaluation (no EVAL/report.json)")
    if not decision:
        missing.append("publish decision (no EVAL/publish.json)")
    prev = ((decision or {}).get("compared") or {}).get("previous_best") or {}
    last_eval = (curves or {}).get("eval", [])
    comparison = {
        "tau": (ev or {}).get("acceptance_length"), "steps": (ev or {}).get("steps"),
        "sim_tau": (ev or {}).get("sim_accept_len_k") or (ev or {}).get("sim_accept_len")
        or (last_eval[-1]["sim_accept_len"] if last_eval else None),
        "previous_tau": prev.get("acceptance_length"), "previous_spec_tps": prev.get("tokens_per_s_spec"),
        "base_tps": (ev or {}).get("tokens_per_s_base"), "spec_tps": (ev or {}).get("tokens_per_s_spec"),
        "sglang_tau": (sglang or {}).get("acceptance_length"),
        "vllm_tau": (((ev or {}).get("engines") or {}).get("vllm") or {}).get("tau"),
    }
    if ev:
        plots["comparison.png"] = plot_comparison(comparison)
    report = {
        "title": title, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": {"prepared": prepared, "stats": stats_dir, "merged": merged, "checkpoint": checkpoint,
                   "evaluation": evaluation},
        "datasets": rows, "datasets_origin": rows_origin,
        "training": None if not curves else {
            "train_events": len(curves["train"]), "eval_events": len(curves["eval"]),
            "last_train": curves["train"][-1] if curves["train"] else None,
            "last_eval": last_eval[-1] if last_eval else None},
        "evaluate": None if not ev else {k: v for k, v in ev.items() if k not in ("prompts", "offline")},
        "acceptance_length": (ev or {}).get("acceptance_length"), "lossless": (ev or {}).get("lossless"),
        "headline": headline_rows(ev), "status": status,
        "comparison": comparison, "publish": decision,
        "sglang": None if not sglang else {k: v for k, v in sglang.items() if k != "phases"},
        "plots": sorted(plots), "missing": missing,
    }
    for name, png in plots.items():
        storage.write_bytes(storage.join(out, name), png)
    storage.write_json(storage.join(out, "report.json"), report)
    from eagle3.report.html import render_html

    storage.write_text(storage.join(out, "report.html"), render_html(report, plots))
    log.info("report: %s (%d plots; missing: %s)", out, len(plots), "; ".join(missing) or "nothing")
    return report


def _task_results(layout: RunLayout) -> dict[str, Any]:
    """{task_id: result, or [results] of a mapped task in map-index order} from the run's summaries folder."""
    results: dict[str, Any] = {}
    mapped: dict[str, list[tuple[int, Any]]] = {}
    for name in storage.list_files(layout.summaries):
        if "/" in name or not name.endswith(".json"):
            continue
        stem = name[: -len(".json")]
        task, _, index = stem.rpartition(".")  # task ids may hold dots (task groups): the map index is last
        value = _json(storage.join(layout.summaries, name))
        if task and index.isdigit():
            mapped.setdefault(task, []).append((int(index), value))
        else:
            results[stem] = value
    for task, items in mapped.items():
        results[task] = [v for _, v in sorted(items, key=lambda iv: iv[0])]
    return results


def _reuse(tasks: dict[str, Any]) -> dict[str, Any]:
    tokenized = {}
    for result in tasks.get("tokenize") or []:
        for name, s in ((result or {}).get("datasets") or {}).items():
            tokenized[name] = "reused" if s.get("reused") else "tokenized"
    extracted = [s for s in tasks.get("extract") or [] if isinstance(s, dict)]
    return {"tokenize": tokenized,
            "extracted_samples": sum(s.get("samples_extracted", 0) for s in extracted),
            "reused_samples": sum(s.get("samples_skipped", 0) for s in extracted),
            "extracted_tokens": sum(s.get("tokens", 0) for s in extracted)}


def run(cfg) -> dict[str, Any]:
    """The run's report folder from the layout's stage outputs, and run_summary.json (RUN_SUMMARY_SCHEMA)."""
    from eagle3.report import failures
    from eagle3.report.summary import run_status

    layout = RunLayout(cfg.root, cfg.dag_id, cfg.run_id)
    paths = layout.paths()
    status = run_status(None if cfg.task_states is None else list(cfg.task_states), failures.read(layout))
    report = write_report(paths["report"], prepared=paths["prepared"], stats_dir=paths["stats"],
                          merged=paths["merged"], checkpoint=paths["checkpoint"], evaluation=paths["eval"],
                          title=f"EAGLE-3 run report: {cfg.dag_id} / {cfg.run_id}", status=status)
    tasks = _task_results(layout)
    reuse = _reuse(tasks)
    storage.write_json(storage.join(paths["report"], "reuse.json"), reuse)
    result = {"out": paths["report"], "plots": report["plots"], "missing": report["missing"],
              "acceptance_length": report["acceptance_length"], "lossless": report["lossless"], "reuse": reuse,
              "failed": [f["task"] for f in status["failed"]]}
    storage.write_json(layout.summary_file, {
        "schema": RUN_SUMMARY_SCHEMA, "dag_id": cfg.dag_id, "run_id": cfg.run_id, "root": cfg.root,
        "paths": paths, "tasks": tasks, "reused": reuse, "report": result, "status": status})
    log.info("report: %s; reused: %s", paths["report"], reuse)
    return result
