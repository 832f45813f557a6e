"""Find one DAG run's artifacts and what the report page shows of them.

Every folder comes from eagle3.layout (the one definition the DAG and the stages use), and what a run's
files say is eagle3.report.collect's, the same content the report stage writes into report.json; the page
builds it from the files while the run is still going (no report yet). This module adds what only the page
needs: the run's state and task states from Airflow, the plots and files it serves, and report.json as written.
Every section is optional: a run that is still going (or failed early) has only some files, and the page says
why each missing one is missing. All reads go through eagle3.storage, so the artifacts root may be local or s3://.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eagle3 import storage
from eagle3.layout import ROOT_ENV, RUN_REPORT, RUN_SUMMARY_SCHEMA, RunLayout, check_id, default_root
from eagle3.report.collect import list_files, read_json

log = logging.getLogger(__name__)

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


def served_files(paths: dict[str, str]) -> dict[str, list[str]]:
    """{folder key: [file names]} the app may serve (flat files with a known suffix)."""
    out = {}
    for key in SERVED_FOLDERS:
        names = [n for n in list_files(paths[key]) if "/" not in n and Path(n).suffix in SERVED_SUFFIXES]
        if names:
            out[key] = names
    return out


def load_run(dag_id: str, run_id: str, root: str | None = None, tasks: list[dict] | None = None,
             state: str | None = None) -> dict:
    """eagle3.report.collect's content of one run (sections are None while their files do not exist), plus what
    the page needs: ``found``, ``run_dir``, ``state``, ``task_states``, ``has_summary``, ``paths``, ``reused``
    (in words), ``plots``, ``report_html`` and ``report`` (report.json as the report stage wrote it).

    ``tasks`` ([{"task_id", "map_index", "state", "name"}]) and ``state`` are the run's task instances and
    state from Airflow's metadata DB (the app reads them); with them the page says what failed and why a
    section is missing."""
    from eagle3.report import failures
    from eagle3.report.collect import collect, task_results, task_state_map
    from eagle3.report.summary import run_status
    from eagle3.report.view import reuse_lines

    layout = RunLayout.checked(root or artifacts_root(), dag_id, run_id)
    paths = layout.paths()
    summary = read_json(layout.summary_file)
    if isinstance(summary, dict) and summary.get("schema") != RUN_SUMMARY_SCHEMA:
        log.warning("%s has schema %r, not %r; its task results are not shown", layout.summary_file,
                    summary.get("schema"), RUN_SUMMARY_SCHEMA)
        summary = None
    summary = summary or {}
    errors = failures.read(layout)
    status = run_status(tasks, errors) if tasks is not None or errors else None
    empty = {"dag_id": dag_id, "run_id": run_id, "run_dir": layout.dir, "found": False, "state": state,
             "status": status, "task_states": task_state_map(tasks),
             "has_summary": bool(summary), "paths": paths, "datasets": None, "verify": None, "extraction": None,
             "training": None, "acceptance": None, "publish": None, "sglang": None, "evaluate": None, "reuse": {},
             "reused": [], "plots": [], "report_html": False, "report": {}}
    # No run folder (another DAG, or a run that has not started): show nothing of the shared
    # prepared/ and store/ folders, which would belong to other runs.
    if not summary and not list_files(layout.dir):
        return empty  # (a run that failed before writing anything still shows its status)
    # The tasks' results as they are now (summaries/), else as the report task saw them (run_summary.json).
    results = task_results(layout.summaries) or summary.get("tasks") or {}
    content = collect(paths, results, status)
    report = read_json(storage.join(paths["report"], RUN_REPORT))
    files = served_files(paths)
    return {
        **empty, **content, "found": True, "reused": reuse_lines(content["reuse"]),
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
    if name not in list_files(folder_uri):
        raise FileNotFoundError(f"{name} not found in {folder_uri}")
    return storage.join(folder_uri, name), SERVED_SUFFIXES[suffix]
