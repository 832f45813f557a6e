"""Render one run (the dict from run_files.load_run) as a self-contained HTML page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from eagle3.report.summary import fmt, fmt_metric  # the one formatter of both pages

_TEMPLATES = Path(__file__).resolve().parent / "templates"
# Columns shown first in the dataset table; other scalar columns follow, long hashes are left out.
_FIRST = ["dataset", "category", "samples", "tokens", "loss_tokens", "rejected", "sample_share", "token_share",
          "tokens_mean", "tokens_p50", "tokens_p95", "tokens_max", "at_cap_share", "extract_hours", "reused", "flagged"]
_HIDDEN = {"fingerprint", "tokenizer_fingerprint", "source_uri", "reject_reasons", "name", "tokens_after_cap"}


# The task whose output each section shows: a missing section says what happened to it.
SECTION_TASKS = {"Dataset stats": ("stats", "stats/stats_table.json"), "Gate verdicts": ("verify", "merged/verify.json"),
                 "Extraction": ("extract", "index-*.json in the store"),
                 "Training": ("train", "checkpoint/metrics.jsonl"), "Acceptance": ("evaluate", "eval/report.json"),
                 "Plots": ("report", "a PNG in the report folder")}


def missing(run: dict, section: str) -> str:
    """Why a section has nothing to show, from the state of the task that writes it."""
    task, what = SECTION_TASKS[section]
    state = (run.get("task_states") or {}).get(task)
    if state == "failed":
        return f"{section} not produced: {task} failed (see Run status above)."
    if state == "upstream_failed":
        return f"{section} not produced: {task} did not run, because an upstream task failed."
    if state == "skipped":
        return f"{section} not produced: {task} was skipped."
    if state == "success":
        return f"{section} not available: {task} succeeded but {what} is missing."
    if state and state != "none":
        return f"{section} not yet available: {task} is {state.replace('_', ' ')}."
    if run.get("state") in ("failed", "success"):
        return f"{section} not produced: {task} never ran in this run."
    return f"{section} not yet available ({what} missing)."


def dataset_columns(rows: list[dict]) -> list[str]:
    seen = {k for r in rows for k, v in r.items() if not isinstance(v, (dict, list))} - _HIDDEN
    return [c for c in _FIRST if c in seen] + sorted(seen - set(_FIRST))


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = fmt
    env.globals["fmt_metric"] = fmt_metric
    env.globals["missing"] = missing
    return env


def render(run: dict, base_url: str) -> str:
    """The page; `base_url` is where the app is mounted (e.g. /eagle3), used for the plot URLs."""
    prefix = f"{base_url.rstrip('/')}/runs/{quote(run['dag_id'], safe='')}/{quote(run['run_id'], safe='')}/files"
    datasets = run["datasets"]
    flagged_names = {f["dataset"] for f in (datasets or {}).get("flagged", [])}
    return _env().get_template("report.html.j2").render(
        run=run, files_url=prefix,
        dataset_cols=dataset_columns(datasets["rows"]) if datasets else [],
        flagged_names=flagged_names,
        report_json=json.dumps(run["report"], indent=2, default=str)[:20000] if run["report"] else "",
    )


def json_safe(value: Any) -> Any:
    """The run dict with tuples as lists and unknown objects as strings."""
    return json.loads(json.dumps(value, default=str))
