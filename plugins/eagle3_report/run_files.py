"""Find one DAG run's artifacts and read what the report page shows.

The DAG writes `<artifacts_root>/runs/<dag_id>/<run_id>/run_summary.json` with the
paths of that run's report folder and stage outputs. Every section below is
optional: a run that is still going (or failed early) has only some files, and
the page shows a "not yet available" placeholder for the rest. All reads go
through eagle3.storage, so the artifacts root may be local or s3://.

run_summary.json keys read here (all optional):
  report_dir                    the folder with report.json, *.png, report.html
  paths | outputs | stages      {name: path} for prepared, stats, merged, vocab,
                                store, checkpoint, draft, eval, report
  summaries                     {task_id: that task's small summary dict}
  reused                        anything the DAG wants to list as reused
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from eagle3 import storage

log = logging.getLogger(__name__)

try:  # an S3 error (access denied, no such bucket) must not take the page down: the section shows as missing
    from botocore.exceptions import BotoCoreError, ClientError

    _READ_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, BotoCoreError, ClientError)
except ImportError:  # local artifacts only
    _READ_ERRORS = (OSError, ValueError)

ARTIFACTS_ENV = "EAGLE3_ARTIFACTS"
# Stage output folders under the run folder when run_summary.json does not name them
# (the layout of dags/eagle3_train.py).
DEFAULT_SUBDIRS = {
    "stats": "stats", "merged": "merged", "vocab": "vocab", "checkpoint": "checkpoint",
    "draft": "draft", "eval": "eval", "report": "report",
}
SERVED_FOLDERS = ("report", "eval", "stats", "checkpoint")  # folders whose plots/files the app serves
SERVED_SUFFIXES = {".png": "image/png", ".html": "text/html; charset=utf-8", ".json": "application/json"}
# Airflow run ids are [A-Za-z0-9_.:+-]-ish; refusing "/" and ".." keeps a URL from leaving the runs folder.
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:+~@-]+$")


def artifacts_root() -> str:
    """EAGLE3_ARTIFACTS, else `$AIRFLOW_HOME/../artifacts` (the DAG's default storage root)."""
    root = os.environ.get(ARTIFACTS_ENV)
    if root:
        return root
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return str(Path(home).resolve().parent / "artifacts")


def check_id(kind: str, value: str) -> str:
    """Refuse ids that could escape the runs folder (path separators, '..')."""
    if not _SAFE_ID.match(value) or value in (".", "..") or ".." in value:
        raise ValueError(f"{kind} {value!r} is not a valid Airflow id (letters, digits, _ . : + - only, no '..')")
    return value


def run_dir(dag_id: str, run_id: str, root: str | None = None) -> str:
    """`<root>/runs/<dag_id>/<run_id>`, the folder that holds run_summary.json."""
    return storage.join(root or artifacts_root(), "runs", check_id("dag_id", dag_id), check_id("run_id", run_id))


def _read_json(uri: str) -> Any | None:
    """A JSON file, or None when it is missing or unreadable (logged: the page still renders)."""
    try:
        if not storage.exists(uri):
            return None
        return storage.read_json(uri)
    except _READ_ERRORS as e:
        log.warning("could not read %s: %s", uri, e)
        return None


def _list(folder: str | None) -> list[str]:
    if not folder:
        return []
    try:
        return storage.list_files(folder)
    except _READ_ERRORS as e:
        log.warning("could not list %s: %s", folder, e)
        return []


def resolve_paths(run: str, summary: dict, root: str | None = None) -> dict[str, str]:
    """Stage name → folder: defaults under the run folder (prepared/ and store/ under the storage root,
    shared between runs), overridden by run_summary.json."""
    paths = {name: storage.join(run, sub) for name, sub in DEFAULT_SUBDIRS.items()}
    if root:
        paths.update(prepared=storage.join(root, "prepared"), store=storage.join(root, "store"))
    for key in ("paths", "outputs", "stages"):
        given = summary.get(key)
        if isinstance(given, dict):
            paths.update({k: str(v) for k, v in given.items() if isinstance(v, str) and v})
    for key in ("report_dir", "prepared", "store"):
        if isinstance(summary.get(key), str):
            paths["report" if key == "report_dir" else key] = summary[key]
    return paths


def _rows(table: Any) -> list[dict] | None:
    """Accept a list of row dicts or {name: row dict}; return rows with a 'dataset' key."""
    if isinstance(table, list) and all(isinstance(r, dict) for r in table):
        return [dict(r, dataset=r.get("dataset", r.get("name", "?"))) for r in table]
    if isinstance(table, dict) and table and all(isinstance(v, dict) for v in table.values()):
        return [dict(v, dataset=v.get("dataset", k)) for k, v in table.items()]
    return None


def read_datasets(paths: dict[str, str], report: dict) -> dict | None:
    """Dataset stats rows and the flagged names, from report.json, the stats folder, or prepared/*/stats.json."""
    # The stats stage's table first: it has the flags and extraction costs; report.json's rows are shorter.
    sources: list[tuple[str, Any]] = []
    for name in _list(paths.get("stats")):
        if name.endswith(".json") and "/" not in name:
            sources.append((storage.join(paths["stats"], name), _read_json(storage.join(paths["stats"], name))))
    sources.append(("report.json", report))
    for origin, doc in sources:
        if not isinstance(doc, dict):
            continue
        for key in ("datasets", "stats", "table", "rows"):
            rows = _rows(doc.get(key))
            if rows:
                flagged = doc.get("flags") or doc.get("flagged") or [r["dataset"] for r in rows if r.get("flagged")]
                _add_reused(paths, rows)
                return {"rows": rows, "flagged": _flag_list(flagged), "origin": origin}
    if paths.get("prepared"):
        rows = []
        for name in _list(paths["prepared"]):
            if name.count("/") == 1 and name.endswith("/stats.json"):
                doc = _read_json(storage.join(paths["prepared"], name))
                if isinstance(doc, dict):
                    rows.append(dict(doc, dataset=doc.get("dataset", name.split("/")[0])))
        if rows:
            return {"rows": rows, "flagged": [], "origin": paths["prepared"] + "/*/stats.json"}
    return None


def _add_reused(paths: dict[str, str], rows: list[dict]) -> None:
    """The stats table has no `reused`; tokenize's prepared/<ds>/stats.json says whether it was skipped."""
    if not paths.get("prepared"):
        return
    for row in rows:
        if "reused" not in row:
            meta = _read_json(storage.join(paths["prepared"], str(row["dataset"]), "stats.json"))
            if isinstance(meta, dict) and "reused" in meta:
                row["reused"] = meta["reused"]


def _flag_list(flagged: Any) -> list[dict]:
    """Flags as [{dataset, reason}] from a list of names, a list of dicts, or {name: reason}."""
    if isinstance(flagged, dict):
        return [{"dataset": k, "reason": v if isinstance(v, str) else json.dumps(v)} for k, v in flagged.items()]
    out = []
    for item in flagged or []:
        if isinstance(item, dict):
            out.append({"dataset": item.get("dataset", item.get("name", "?")),
                        "reason": item.get("message") or item.get("reason")
                        or json.dumps({k: v for k, v in item.items() if k != "dataset"})})
        else:
            out.append({"dataset": str(item), "reason": ""})
    return out


def read_extraction(paths: dict[str, str], summaries: dict) -> dict | None:
    """Shards, samples and tokens written so far, from the store's index-*.json files (and the task summary)."""
    stores: dict[str, dict] = {}
    for name in _list(paths.get("store")):
        folder, _, base = name.rpartition("/")
        if base.startswith("index-") and base.endswith(".json"):
            index = _read_json(storage.join(paths["store"], name)) or {}
            entry = stores.setdefault(folder or ".", {"store": folder or ".", "tasks": 0, "shards": 0,
                                                      "samples": 0, "tokens": 0})
            entry["tasks"] += 1
            for shard in index.values():
                if isinstance(shard, dict):
                    entry["shards"] += 1
                    entry["samples"] += int(shard.get("samples", 0))
                    entry["tokens"] += int(shard.get("tokens", 0))
    merged = _read_json(storage.join(paths["merged"], "manifest.json")) if paths.get("merged") else None
    planned = None
    if isinstance(merged, dict) and isinstance(merged.get("totals"), dict):
        totals = merged["totals"]
        planned = totals.get("samples_out", totals.get("samples"))
    summary = _sum_mapped(summaries.get("extract"))
    if not stores and not summary:
        return None
    return {"stores": list(stores.values()), "planned_samples": planned, "summary": summary}


def _sum_mapped(summary: Any) -> dict | None:
    """A mapped task's summaries (one per shard) summed field by field; a single dict as it is."""
    if isinstance(summary, dict):
        return summary
    if not isinstance(summary, list):
        return None
    total: dict[str, Any] = {"tasks": 0}
    for item in summary:
        if isinstance(item, dict):
            total["tasks"] += 1
            for k, v in item.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    total[k] = total.get(k, 0) + v
    return total if total["tasks"] else None


def read_training(paths: dict[str, str]) -> dict | None:
    """The last metrics.jsonl record and the newest checkpoint step."""
    ckpt = paths.get("checkpoint")
    if not ckpt:
        return None
    events: list[dict] = []
    metrics = storage.join(ckpt, "metrics.jsonl")
    try:
        if storage.exists(metrics):
            events = [json.loads(line) for line in storage.read_text(metrics).splitlines() if line.strip()]
    except _READ_ERRORS as e:
        log.warning("could not read %s: %s", metrics, e)
    latest = _read_json(storage.join(ckpt, "latest.json"))
    if not events and latest is None:
        return None
    return {"events": len(events), "last": events[-1] if events else None, "latest": latest}


def read_acceptance(paths: dict[str, str], report: dict) -> dict | None:
    """τ and tok/s of this draft against the no-speculation baseline and the previous best draft.

    From the evaluate stage's eval/report.json and the publish stage's eval/publish.json
    (its `compared.previous_best` and decision); report.json of the report folder as a fallback.
    """
    evaluation = _read_json(storage.join(paths["eval"], "report.json")) if paths.get("eval") else None
    doc = evaluation if isinstance(evaluation, dict) else report.get("evaluate") or report.get("acceptance")
    if not isinstance(doc, dict) and "acceptance_length" in report:
        doc = report
    if not isinstance(doc, dict):
        return None
    publish = _read_json(storage.join(paths["eval"], "publish.json")) if paths.get("eval") else None
    publish = publish if isinstance(publish, dict) else {}
    previous = (publish.get("compared") or {}).get("previous_best") or doc.get("previous_best") or doc.get("previous")
    rates = doc.get("accept_rate_by_position")
    return {
        "tau": doc.get("acceptance_length"), "lossless": doc.get("lossless"), "speedup": doc.get("speedup"),
        "tokens_per_s_spec": doc.get("tokens_per_s_spec"), "tokens_per_s_base": doc.get("tokens_per_s_base"),
        "steps": doc.get("steps"), "prompts": doc.get("num_prompts", doc.get("prompts")),
        "sim_accept_len": doc.get("sim_accept_len"),
        "accept_rate_by_position": rates if isinstance(rates, list) else None,
        "previous": previous if isinstance(previous, dict) else None,
        "published": publish.get("published"), "publish_reason": publish.get("reason"),
    }


def _reused(summary: dict, report: dict, datasets: dict | None, extraction: dict | None) -> list[str]:
    """Human lines saying what this run did not redo."""
    lines = []
    for row in (datasets or {}).get("rows", []):
        if row.get("reused") is True:
            lines.append(f"dataset {row['dataset']}: tokenization reused (fingerprint unchanged)")
    recorded = [doc.get("reused") for doc in (summary, report) if doc.get("reused")]
    for given in recorded:  # the DAG's own record (run_summary.json) says it best
        if isinstance(given, list):
            lines += [x if isinstance(x, str) else json.dumps(x) for x in given]
        elif isinstance(given, dict):
            lines += _reuse_lines(given)
    ext = (extraction or {}).get("summary") or {}
    if not recorded and isinstance(ext, dict):
        lines += [f"extraction: {key} = {ext[key]}" for key in ("samples_skipped", "skipped", "reused") if ext.get(key)]
    return list(dict.fromkeys(lines))


def _reuse_lines(reuse: dict) -> list[str]:
    """The DAG's reuse record ({tokenize: {dataset: reused|tokenized}, reused_samples, extracted_samples, ...})."""
    lines = []
    for key, value in reuse.items():
        if key == "tokenize" and isinstance(value, dict):
            lines += [f"dataset {ds}: tokenization reused (fingerprint unchanged)"
                      for ds, state in value.items() if state == "reused"]
        elif key == "reused_samples":
            lines.append(f"extraction: {value:,} samples already in the store, not extracted again"
                         if isinstance(value, int) else f"extraction: reused {value}")
        elif key in ("extracted_samples", "extracted_tokens"):
            continue  # shown with the extraction, not reuse
        else:
            lines.append(f"{key}: {value if isinstance(value, str) else json.dumps(value)}")
    return lines


def served_files(paths: dict[str, str]) -> dict[str, list[str]]:
    """{folder key: [file names]} the app may serve (flat files with a known suffix)."""
    out = {}
    for key in SERVED_FOLDERS:
        names = [n for n in _list(paths.get(key)) if "/" not in n and Path(n).suffix in SERVED_SUFFIXES]
        if names:
            out[key] = names
    return out


def load_run(dag_id: str, run_id: str, root: str | None = None) -> dict:
    """Everything the page shows for one run; sections are None when their files do not exist yet."""
    root = root or artifacts_root()
    run = run_dir(dag_id, run_id, root)
    summary = _read_json(storage.join(run, "run_summary.json"))
    summary = summary if isinstance(summary, dict) else {}
    paths = resolve_paths(run, summary, root)
    empty = {"dag_id": dag_id, "run_id": run_id, "run_dir": run, "found": False, "has_summary": False,
             "paths": paths, "datasets": None, "verify": None, "extraction": None, "training": None,
             "acceptance": None, "reused": [], "plots": [], "report_html": False, "report": {}}
    # No run folder (another DAG, or a run that has not started): show nothing of the shared
    # prepared/ and store/ folders, which would belong to other runs.
    if not summary and not _list(run):
        return empty
    report = _read_json(storage.join(paths["report"], "report.json"))
    report = report if isinstance(report, dict) else {}
    summaries = summary.get("summaries") if isinstance(summary.get("summaries"), dict) else {}
    datasets = read_datasets(paths, report)
    extraction = read_extraction(paths, summaries)
    files = served_files(paths)
    return {
        **empty, "found": True, "has_summary": bool(summary),
        "datasets": datasets,
        "verify": _read_json(storage.join(paths["merged"], "verify.json")) if paths.get("merged") else None,
        "extraction": extraction,
        "training": read_training(paths),
        "acceptance": read_acceptance(paths, report),
        "reused": _reused(summary, report, datasets, extraction),
        "plots": [(key, n) for key, names in files.items() for n in names if n.endswith(".png")],
        "report_html": "report.html" in files.get("report", []),
        "report": report,
    }


def file_uri(dag_id: str, run_id: str, folder: str, name: str, root: str | None = None) -> tuple[str, str]:
    """(uri, media type) of a file the app serves; ValueError/FileNotFoundError otherwise."""
    if folder not in SERVED_FOLDERS:
        raise ValueError(f"folder {folder!r} is not served; one of {', '.join(SERVED_FOLDERS)}")
    suffix = Path(name).suffix
    if "/" in name or suffix not in SERVED_SUFFIXES:
        raise ValueError(f"file {name!r} is not served; plain names ending {', '.join(SERVED_SUFFIXES)}")
    root = root or artifacts_root()
    run = run_dir(dag_id, run_id, root)
    summary = _read_json(storage.join(run, "run_summary.json"))
    paths = resolve_paths(run, summary if isinstance(summary, dict) else {}, root)
    # Only names that the folder listing returns: nothing outside the folder is reachable.
    if name not in _list(paths.get(folder)):
        raise FileNotFoundError(f"{name} not found in {paths.get(folder)}")
    return storage.join(paths[folder], name), SERVED_SUFFIXES[suffix]
