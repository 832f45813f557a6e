"""Find one DAG run's artifacts and read what the report page shows.

Every folder comes from eagle3.layout (the one definition the DAG and the stages use), and
every file is read in the one format its stage writes: the stats table, verify.json, the
store's index files, the checkpoint's metrics (eagle3.checkpoint), evaluate's report.json,
publish.json, and run_summary.json (eagle3.layout.RUN_SUMMARY_SCHEMA). Every section is
optional: a run that is still going (or failed early) has only some files, and the page
shows a "not yet available" placeholder for the rest. All reads go through eagle3.storage,
so the artifacts root may be local or s3://.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from eagle3 import storage
from eagle3.errors import InputError
from eagle3.layout import ROOT_ENV, RUN_SUMMARY_SCHEMA, RunLayout, check_id, default_root

log = logging.getLogger(__name__)

try:  # an S3 error (access denied, no such bucket) must not take the page down: the section shows as missing
    from botocore.exceptions import BotoCoreError, ClientError

    _READ_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, BotoCoreError, ClientError)
except ImportError:  # local artifacts only
    _READ_ERRORS = (OSError, ValueError)

ARTIFACTS_ENV = ROOT_ENV
SERVED_FOLDERS = ("report", "eval", "stats", "checkpoint")  # folders whose plots/files the app serves
SERVED_SUFFIXES = {".png": "image/png", ".html": "text/html; charset=utf-8", ".json": "application/json"}

__all__ = ["ARTIFACTS_ENV", "artifacts_root", "check_id", "file_uri", "load_run", "run_dir"]


def artifacts_root() -> str:
    """The storage root the DAG writes under by default (eagle3.layout.default_root)."""
    return default_root()


def run_dir(dag_id: str, run_id: str, root: str | None = None) -> str:
    """`<root>/runs/<dag_id>/<run_id>`; refuses ids that could leave the runs folder."""
    return RunLayout.checked(root or artifacts_root(), dag_id, run_id).dir


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


def read_datasets(paths: dict[str, str], reused: dict) -> dict | None:
    """The stats stage's table (stats/stats_table.json) with each dataset's tokenize reuse."""
    table = _read_json(storage.join(paths["stats"], "stats_table.json"))
    if not isinstance(table, dict) or not isinstance(table.get("datasets"), list):
        return None
    state = reused.get("tokenize") or {}
    rows = [dict(r, reused=state[r["dataset"]] == "reused") if r.get("dataset") in state else dict(r)
            for r in table["datasets"] if isinstance(r, dict)]
    flagged = [{"dataset": f.get("dataset"), "reason": f.get("message", "")} for f in table.get("flags") or []]
    return {"rows": rows, "flagged": flagged, "origin": storage.join(paths["stats"], "stats_table.json")}


def read_extraction(paths: dict[str, str], tasks: dict) -> dict | None:
    """Shards, samples and tokens written so far, from the store's index-*.json files, and this run's
    extract tasks' results summed."""
    from eagle3.extract.store_format import is_index_name

    stores: dict[str, dict] = {}
    for name in _list(paths["store"]):
        folder, _, base = name.rpartition("/")
        if not is_index_name(base):
            continue
        index = _read_json(storage.join(paths["store"], name)) or {}
        entry = stores.setdefault(folder, {"store": folder, "tasks": 0, "shards": 0, "samples": 0, "tokens": 0})
        entry["tasks"] += 1
        for shard in index.values():
            entry["shards"] += 1
            entry["samples"] += int(shard.get("samples", 0))
            entry["tokens"] += int(shard.get("tokens", 0))
    manifest = _read_json(storage.join(paths["merged"], "manifest.json"))
    planned = (manifest.get("totals") or {}).get("samples_out") if isinstance(manifest, dict) else None
    results = [r for r in tasks.get("extract") or [] if isinstance(r, dict)]
    summary = None
    if results:
        keys = ("samples_in_task", "samples_skipped", "samples_extracted", "tokens", "shards_written",
                "bytes_written")
        summary = {"tasks": len(results), **{k: sum(int(r.get(k) or 0) for r in results) for k in keys}}
    if not stores and not summary:
        return None
    return {"stores": list(stores.values()), "planned_samples": planned, "summary": summary}


def read_training(paths: dict[str, str]) -> dict | None:
    """The last metrics.jsonl event (its scalars, and its per-TTT-step lists) and the newest complete
    checkpoint step."""
    from eagle3.checkpoint import METRICS_FILE, latest_step_dir, read_metrics

    ckpt = paths["checkpoint"]
    try:
        events = read_metrics(storage.join(ckpt, METRICS_FILE))
        latest = latest_step_dir(ckpt)
    except (InputError,) + _READ_ERRORS as e:  # a half-written run must not take the page down
        log.warning("could not read the checkpoint folder %s: %s", ckpt, e)
        return None
    if not events and latest is None:
        return None
    last = events[-1] if events else None
    flat = None if last is None else {k: v for k, v in last.items() if not isinstance(v, (list, dict))}
    per_step = None if last is None else {k: v for k, v in last.items()
                                          if isinstance(v, list) and v and all(isinstance(x, (int, float, type(None)))
                                                                               for x in v)}
    return {"events": len(events), "last": flat, "per_step": per_step or None,
            "latest": latest.rsplit("/", 1)[-1] if latest else None}


def read_acceptance(paths: dict[str, str]) -> dict | None:
    """τ, rates, tok/s and the lossless verdict of every engine and prompt set (eagle3.report.summary, the one
    place that labels them), against the previous best draft, from evaluate's eval/report.json and publish's
    eval/publish.json."""
    from eagle3.report.summary import headline_rows, lossless_text

    doc = _read_json(storage.join(paths["eval"], "report.json"))
    if not isinstance(doc, dict):
        return None
    publish = _read_json(storage.join(paths["eval"], "publish.json"))
    publish = publish if isinstance(publish, dict) else {}
    previous = (publish.get("compared") or {}).get("previous_best")
    precision = doc.get("precision")
    return {
        "rows": headline_rows(doc), "tau": doc.get("acceptance_length"), "lossless": doc.get("lossless"),
        "lossless_text": lossless_text(doc), "speedup": doc.get("speedup"),
        "tokens_per_s_spec": doc.get("tokens_per_s_spec"), "tokens_per_s_base": doc.get("tokens_per_s_base"),
        "steps": doc.get("steps"), "max_new_tokens": doc.get("max_new_tokens"), "prompts": doc.get("num_prompts"),
        "sim_accept_len": doc.get("sim_accept_len_k") or doc.get("sim_accept_len"),
        "accept_rate_by_position": doc.get("accept_rate_by_position"),
        "device": doc.get("device"), "precision": precision.get("name") if isinstance(precision, dict) else precision,
        "previous": previous if isinstance(previous, dict) else None,
        "published": publish.get("published"), "publish_reason": publish.get("reason"),
    }


def reuse_lines(reused: dict) -> list[str]:
    """Human lines saying what this run did not redo (run_summary.json's ``reused``)."""
    lines = [f"dataset {ds}: tokenization reused (fingerprint unchanged)"
             for ds, state in sorted((reused.get("tokenize") or {}).items()) if state == "reused"]
    if reused.get("reused_samples"):
        lines.append(f"extraction: {reused['reused_samples']:,} samples already in the store, not extracted again")
    return lines


def served_files(paths: dict[str, str]) -> dict[str, list[str]]:
    """{folder key: [file names]} the app may serve (flat files with a known suffix)."""
    out = {}
    for key in SERVED_FOLDERS:
        names = [n for n in _list(paths[key]) if "/" not in n and Path(n).suffix in SERVED_SUFFIXES]
        if names:
            out[key] = names
    return out


_PRECEDENCE = ("failed", "upstream_failed", "running", "queued", "scheduled", "up_for_retry", "deferred", "none",
               "success", "skipped")


def task_states(tasks: list[dict] | None) -> dict[str, str]:
    """{task_id: state}; a mapped task's instances folded into one (any failed: failed; then any not
    finished; all skipped: skipped)."""
    out: dict[str, str] = {}
    for t in tasks or []:
        state = t.get("state") or "none"
        before = out.get(t["task_id"])
        rank = _PRECEDENCE.index(state) if state in _PRECEDENCE else 7
        if before is None or rank < (_PRECEDENCE.index(before) if before in _PRECEDENCE else 7):
            out[t["task_id"]] = state
    return out


def load_run(dag_id: str, run_id: str, root: str | None = None, tasks: list[dict] | None = None,
             state: str | None = None) -> dict:
    """Everything the page shows for one run; sections are None when their files do not exist yet.

    ``tasks`` ([{"task_id", "map_index", "state", "name"}]) and ``state`` are the run's task instances and
    state from Airflow's metadata DB (the app reads them); with them the page says what failed and why a
    section is missing."""
    from eagle3.report import failures
    from eagle3.report.summary import run_status

    layout = RunLayout.checked(root or artifacts_root(), dag_id, run_id)
    paths = layout.paths()
    summary = _read_json(layout.summary_file)
    if isinstance(summary, dict) and summary.get("schema") != RUN_SUMMARY_SCHEMA:
        log.warning("%s has schema %r, not %r; its task results are not shown", layout.summary_file,
                    summary.get("schema"), RUN_SUMMARY_SCHEMA)
        summary = None
    summary = summary or {}
    errors = failures.read(layout)
    status = run_status(tasks, errors) if tasks is not None or errors else None
    empty = {"dag_id": dag_id, "run_id": run_id, "run_dir": layout.dir, "found": False, "state": state,
             "status": status, "task_states": task_states(tasks),
             "has_summary": bool(summary), "paths": paths, "datasets": None, "verify": None, "extraction": None,
             "training": None, "acceptance": None, "reused": [], "plots": [], "report_html": False, "report": {}}
    # No run folder (another DAG, or a run that has not started): show nothing of the shared
    # prepared/ and store/ folders, which would belong to other runs.
    if not summary and not _list(layout.dir):
        return empty  # (a run that failed before writing anything still shows its status)
    report = _read_json(storage.join(paths["report"], "report.json"))
    reused = summary.get("reused") or {}
    files = served_files(paths)
    return {
        **empty, "found": True,
        "datasets": read_datasets(paths, reused),
        "verify": _read_json(storage.join(paths["merged"], "verify.json")),
        "extraction": read_extraction(paths, summary.get("tasks") or {}),
        "training": read_training(paths),
        "acceptance": read_acceptance(paths),
        "reused": reuse_lines(reused),
        "plots": [(key, n) for key, names in files.items() for n in names if n.endswith(".png")],
        "report_html": "report.html" in files.get("report", []),
        "report": report if isinstance(report, dict) else {},
    }


def file_uri(dag_id: str, run_id: str, folder: str, name: str, root: str | None = None) -> tuple[str, str]:
    """(uri, media type) of a file the app serves; ValueError/FileNotFoundError otherwise."""
    if folder not in SERVED_FOLDERS:
        raise ValueError(f"folder {folder!r} is not served; one of {', '.join(SERVED_FOLDERS)}")
    suffix = Path(name).suffix
    if "/" in name or suffix not in SERVED_SUFFIXES:
        raise ValueError(f"file {name!r} is not served; plain names ending {', '.join(SERVED_SUFFIXES)}")
    folder_uri = RunLayout.checked(root or artifacts_root(), dag_id, run_id).folder(folder)
    # Only names that the folder listing returns: nothing outside the folder is reachable.
    if name not in _list(folder_uri):
        raise FileNotFoundError(f"{name} not found in {folder_uri}")
    return storage.join(folder_uri, name), SERVED_SUFFIXES[suffix]
