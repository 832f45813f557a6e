"""Where every artifact lives under a storage root: the one definition of the folder layout.

The DAG, the stages, the report and the UI plugin all build paths here::

    <root>/prepared/<dataset>/          tokenized datasets, shared between runs (fingerprint-keyed)
    <root>/regenerated/<dataset>/       datasets whose answers the target regenerated
    <root>/store/<model_fp>-L..-<opt>/  the hidden-state store, shared between runs (content-addressed)
    <root>/registry/                    published drafts and the publish gate's history
    <root>/runs/<dag_id>/<run_id>/      one DAG run:
        stats/ merged/ vocab/ checkpoint/ draft/ eval/ report/   one folder per stage output
        summaries/<task_id>[.<map_index>].json                    each task's result (the one result protocol)
        errors/<task_id>[.<map_index>].json                       a failed task's error (eagle3.report.failures)
        run_summary.json                                          RUN_SUMMARY_SCHEMA, written by the report task

Paths are joined with "/" (never normalised), so the same functions build local
paths, ``s3://`` URIs and the DAG's Jinja templates (``{{ params.storage_root }}``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "EAGLE3_ARTIFACTS"
RUN_FOLDERS = ("stats", "merged", "vocab", "checkpoint", "draft", "eval", "report")
SHARED_FOLDERS = ("prepared", "regenerated", "store", "registry")
SUMMARIES = "summaries"
ERRORS = "errors"
RUN_SUMMARY = "run_summary.json"
RUN_SUMMARY_SCHEMA = "eagle3-run-summary/1"
"""run_summary.json, written by the report task, read by the UI plugin:

    schema    RUN_SUMMARY_SCHEMA
    dag_id, run_id, root
    paths     {folder: uri} for every name in RUN_FOLDERS and SHARED_FOLDERS
    tasks     {task_id: its result, or [results] for a mapped task}
    reused    {"tokenize": {dataset: "reused" | "tokenized"}, "extracted_samples", "reused_samples",
               "extracted_tokens"}
    report    the report stage's own result (its files and plots)
    status    the run's tasks at report time (eagle3.report.summary.run_status): failed (with their first
              error lines), not_run, skipped, counts
"""

# The files the stage folders above hold, named once for the stages that write them and everything that reads them.
PREPARED_PARQUET = "tokenized.parquet"
"""prepared/<dataset>/: the tokenized samples (tokenize)."""
PREPARED_STATS = "stats.json"
"""prepared/<dataset>/: counts, fingerprint inputs and the Parquet's sha256 (tokenize; merge checks it)."""
MERGED_PARQUET = "train.parquet"
"""merged/: the shuffled training samples (merge)."""
MERGED_MANIFEST = "manifest.json"
"""merged/: the merge's commit marker, with the Parquet's sha256 (merge; vocab, verify and extract check it)."""
VERIFY_RESULT = "verify.json"
"""merged/: the verify gate's checks (verify)."""
EVAL_REPORT = "report.json"
"""eval/: the headline engine's report (evaluate; publish, the run report and the UI read it)."""
RUN_REPORT = "report.json"
"""report/: the run report's figures (the report stage; the UI plugin reads them)."""


def engine_report(backend: str) -> str:
    """eval/: the report of an engine that evaluate compared with the headline one."""
    return f"{backend}_{EVAL_REPORT}"


# Airflow run ids are [A-Za-z0-9_.:+-]-ish; refusing "/" and ".." keeps a URL from leaving the runs folder.
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:+~@-]+$")


def join(base: str, *parts: str) -> str:
    """``base/part/...`` with single slashes; keeps ``s3://`` and Jinja templates intact."""
    return "/".join([str(base).rstrip("/"), *(str(p).strip("/") for p in parts)])


def default_root() -> str:
    """$EAGLE3_ARTIFACTS, else ``$AIRFLOW_HOME/../artifacts`` (``make demo`` and ``make airflow`` use it)."""
    root = os.environ.get(ROOT_ENV)
    if root:
        return root
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return str(Path(home).resolve().parent / "artifacts")


def prepared(root: str) -> str:
    return join(root, "prepared")


def regenerated(root: str) -> str:
    return join(root, "regenerated")


def regenerated_source(root: str, dataset: str) -> str:
    """The regenerated JSONL that replaces ``dataset``'s source for tokenize."""
    from eagle3.regenerate.output import RECORDS

    return join(regenerated(root), dataset, RECORDS)


def store(root: str) -> str:
    return join(root, "store")


def registry(root: str) -> str:
    return join(root, "registry")


def check_id(kind: str, value: str) -> str:
    """Refuse ids that could escape the runs folder (path separators, '..')."""
    if not isinstance(value, str) or not _SAFE_ID.match(value) or ".." in value:
        raise ValueError(f"{kind} {value!r} is not a valid Airflow id (letters, digits, _ . : + - only, no '..')")
    return value


def runs(root: str, dag_id: str) -> str:
    """The folder holding one sub-folder per run of ``dag_id``."""
    return join(root, "runs", dag_id)


@dataclass(frozen=True)
class RunLayout:
    """The folders of one DAG run under a storage root."""

    root: str
    dag_id: str
    run_id: str

    @property
    def dir(self) -> str:
        return join(runs(self.root, self.dag_id), self.run_id)

    def folder(self, name: str) -> str:
        if name in SHARED_FOLDERS:
            return join(self.root, name)
        if name not in RUN_FOLDERS:
            raise KeyError(f"no folder {name!r} in a run; known: {', '.join(RUN_FOLDERS + SHARED_FOLDERS)}")
        return join(self.dir, name)

    def paths(self) -> dict[str, str]:
        """{folder name: uri} for every run and shared folder."""
        return {name: self.folder(name) for name in RUN_FOLDERS + SHARED_FOLDERS}

    @property
    def summary_file(self) -> str:
        return join(self.dir, RUN_SUMMARY)

    @property
    def summaries(self) -> str:
        return join(self.dir, SUMMARIES)

    def task_result(self, task_id: str, map_index: int | None = None) -> str:
        """Where a task's result is kept: ``summaries/<task_id>.json`` or ``summaries/<task_id>.<i>.json``."""
        name = task_id if map_index is None or map_index < 0 else f"{task_id}.{map_index}"
        return join(self.summaries, f"{name}.json")

    def task_error(self, task_id: str, map_index: int | None = None) -> str:
        """Where a failed task's error is kept: ``errors/<task_id>[.<i>].json`` (removed when it succeeds)."""
        name = task_id if map_index is None or map_index < 0 else f"{task_id}.{map_index}"
        return join(self.dir, ERRORS, f"{name}.json")

    @classmethod
    def checked(cls, root: str, dag_id: str, run_id: str) -> "RunLayout":
        """A layout for ids that come from outside (URLs): refuses ids that could leave the runs folder."""
        return cls(root, check_id("dag_id", dag_id), check_id("run_id", run_id))
