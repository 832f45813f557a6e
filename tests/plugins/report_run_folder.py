"""Test helper: a hand-made run folder with every file the report page reads, as the DAG and stages lay it out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
if str(PLUGINS) not in sys.path:  # Airflow puts the plugins folder on sys.path; the unit tests do the same
    sys.path.insert(0, str(PLUGINS))

DAG_ID = "eagle3_train"
RUN_ID = "manual__2026-11-29T09:00:00+00:00"


def _png(path: Path, title: str, ys: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2.6), dpi=80)
    ax.plot(range(len(ys)), ys, marker="o")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_run(root: Path, dag_id: str = DAG_ID, run_id: str = RUN_ID) -> Path:
    """Write a finished run: run_summary.json, stats, verify, store index, metrics, eval report, plots."""
    run = root / "runs" / dag_id / run_id
    for sub in ("stats", "merged", "checkpoint", "eval", "report"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    store = root / "store" / "abc123-L1_13_26-bf16"
    store.mkdir(parents=True)
    (run / "stats" / "stats_table.json").write_text(json.dumps({
        "datasets": [
            {"dataset": "arithmetic", "samples": 930, "tokens": 70_000, "loss_tokens": 20_000,
             "sample_share": 0.93, "token_share": 0.68},
            {"dataset": "long_agent", "samples": 70, "tokens": 33_000, "loss_tokens": 9_000,
             "sample_share": 0.07, "token_share": 0.32, "flagged": True},
        ],
        "flags": [{"dataset": "long_agent", "ratio": 4.6, "message": "token share 32% vs sample share 7%"}],
    }))
    (root / "prepared" / "long_agent").mkdir(parents=True)
    (root / "prepared" / "long_agent" / "stats.json").write_text(json.dumps({"dataset": "long_agent", "reused": False}))
    (run / "merged" / "verify.json").write_text(json.dumps({"passed": False, "checks": [
        {"name": "counts_add_up", "passed": True, "detail": "1000 in = 990 out + 10 drops"},
        {"name": "lengths_within_max_seq_len", "passed": False, "detail": "3 samples longer than 2048"},
    ]}))
    (run / "merged" / "manifest.json").write_text(json.dumps({"totals": {"samples_out": 990}}))
    (store / "index-0.json").write_text(json.dumps({
        "shard-0-0.safetensors": {"sha256": "x", "samples": 400, "tokens": 40_000, "sample_ids": []},
        "shard-0-1.safetensors": {"sha256": "y", "samples": 95, "tokens": 9_500, "sample_ids": []},
    }))
    (store / "index-1.json").write_text(json.dumps({
        "shard-1-0.safetensors": {"sha256": "z", "samples": 300, "tokens": 30_000, "sample_ids": []},
    }))
    (run / "checkpoint" / "metrics.jsonl").write_text("".join(
        json.dumps({"event": "train", "step": s, "loss": 3.0 - s / 100, "loss_i": [3.0 - s / 100],
                    "acc_i": [0.3 + s / 1000], "sim_accept_len": 1.8 + s / 500}) + "\n" for s in (10, 20, 30)))
    step = run / "checkpoint" / "step-00000030"  # a complete step folder, as eagle3.checkpoint writes it
    step.mkdir()
    for name in ("model.safetensors", "optimizer.safetensors", "train_state.json", "config.json"):
        (step / name).write_text("{}")
    (run / "checkpoint" / "latest.json").write_text(json.dumps({"step": 30, "dir": "step-00000030"}))
    (run / "eval" / "report.json").write_text(json.dumps({
        "acceptance_length": 2.61, "lossless": True, "tokens_per_s_spec": 41.5, "tokens_per_s_base": 30.2,
        "speedup": 1.37, "steps": 3, "num_prompts": 20, "accept_rate_by_position": [0.8, 0.6, 0.45],
        "prompts": [{"prompt": "def f():", "lossless": True}],
    }))
    (run / "eval" / "publish.json").write_text(json.dumps({
        "published": True, "reason": "beats the previous best τ 2.100 (entry e-old)",
        "compared": {"previous_best": {"id": "e-old", "acceptance_length": 2.1, "tokens_per_s_spec": 35.0}},
    }))
    (run / "report" / "report.html").write_text("<html><body><img src='training_curves.png'></body></html>")
    _png(run / "report" / "training_curves.png", "loss_0", [3.0, 2.5, 2.2, 2.1])
    _png(run / "report" / "acceptance_by_position.png", "accept rate", [0.8, 0.6, 0.45])
    # report.py's report.json: short dataset rows without flags (the stats table must win for the flags).
    (run / "report" / "report.json").write_text(json.dumps({
        "run_id": run_id, "datasets": [{"dataset": "arithmetic", "samples": 930, "tokens": 70_000}],
        "acceptance_length": 2.61}))
    # run_summary.json in eagle3.layout's schema, as the report stage writes it.
    from eagle3.layout import RUN_SUMMARY_SCHEMA, RunLayout

    (run / "run_summary.json").write_text(json.dumps({
        "schema": RUN_SUMMARY_SCHEMA, "dag_id": dag_id, "run_id": run_id, "root": str(root),
        "paths": RunLayout(str(root), dag_id, run_id).paths(),
        "tasks": {"stats": {"datasets": 2}, "tokenize": [{"datasets": {"arithmetic": {"reused": True}}},
                               {"datasets": {"long_agent": {"reused": False}}}],
                  "extract": [{"samples_extracted": 495, "samples_skipped": 100, "tokens": 49_500},
                              {"samples_extracted": 300, "samples_skipped": 95, "tokens": 30_000}]},
        "reused": {"tokenize": {"arithmetic": "reused", "long_agent": "tokenized"},
                   "extracted_samples": 795, "reused_samples": 195, "extracted_tokens": 79_500},
        "report": {},
    }))
    return run


def write_real_report(run: Path, root: Path) -> list[str]:
    """Replace the hand-made report folder by the one eagle3.report writes for this run; its PNG names."""
    import shutil

    from eagle3.report import ReportConfig, report

    shutil.rmtree(run / "report")
    out = report(ReportConfig(str(root), run.parent.name, run.name))
    return sorted(out["plots"])

