"""The regenerated dataset on disk: an append-only JSONL that survives a kill.

Each finished conversation is one line, written with flush + fsync, so a
SIGKILL loses at most the conversations still in flight. On restart a torn
last line (killed mid-write) is cut off, and the ids already present are
skipped. When every conversation is done the file is rewritten atomically in
source order, so two runs with the same answers give the same bytes (and the
same tokenize fingerprint).

Output folder, per dataset: ``OUT/<dataset>/regenerated.jsonl`` (format
``messages``), ``stats.json``, ``errors.jsonl``. ``OUT/manifest.yaml`` is the
input manifest with each regenerated dataset's source replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from eagle3 import storage
from eagle3.errors import InputError

RECORDS = "regenerated.jsonl"
STATS = "stats.json"
ERRORS = "errors.jsonl"
DERIVED_MANIFEST = "manifest.yaml"


def work_dir(out: str, dataset: str) -> Path:
    """Local folder the dataset's files are written in (a cache folder when ``out`` is on S3)."""
    if storage.is_s3(out):
        key = hashlib.sha256(out.encode()).hexdigest()[:16]
        return storage.cache_dir() / "regenerate" / key / dataset
    return Path(out, dataset)


class RecordLog:
    """Append-only JSONL of finished conversations, keyed by conversation id."""

    def __init__(self, path: Path, settings: dict[str, Any], restart: bool = False):
        self.path = path
        self.settings = settings
        path.parent.mkdir(parents=True, exist_ok=True)
        if restart and path.exists():
            path.unlink()
        self.done: dict[str, dict[str, Any]] = {}  # id -> {"line", "prompt_tokens", "completion_tokens", ...}
        self._load()
        self._f = open(path, "ab")

    def _load(self) -> None:
        if not self.path.exists():
            return
        good_bytes = 0
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, start=1):
                if not raw.endswith(b"\n"):
                    break  # torn by a kill mid-write: dropped below, redone by this run
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError:
                    break
                made_with = {k: v for k, v in rec["regeneration"].items() if k in self.settings}
                if made_with != self.settings:
                    differ = sorted(k for k in self.settings if made_with.get(k) != self.settings[k])
                    raise InputError(
                        f"{self.path}:{n}: conversation {rec['id']} was regenerated with "
                        + ", ".join(f"{k}={made_with.get(k)!r}" for k in differ) + "; this run asks for "
                        + ", ".join(f"{k}={self.settings[k]!r}" for k in differ) + ". To regenerate the dataset "
                        "with this run's settings: in the Airflow trigger form, switch on \"Regenerate from "
                        "scratch\" (regenerate_restart), or set another storage root; on the command line, pass "
                        "--restart or a new --out folder. To reuse the kept answers, set the settings back."
                    )
                self.done[rec["id"]] = _summary(rec)
                good_bytes += len(raw)
        if good_bytes < self.path.stat().st_size:
            with open(self.path, "r+b") as f:
                f.truncate(good_bytes)

    def append(self, record: dict[str, Any]) -> None:
        self._f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._f.flush()
        os.fsync(self._f.fileno())
        self.done[record["id"]] = _summary(record)

    def close(self) -> None:
        self._f.close()

    def rewrite(self, keep_ids: set[str]) -> None:
        """Rewrite the file in source order, keeping only ``keep_ids`` (conversations of a source
        that changed since an earlier run are dropped); atomic, called when nothing is in flight."""
        self.close()
        lines = [raw for raw in self.path.read_bytes().splitlines(keepends=True)
                 if json.loads(raw)["id"] in keep_ids]
        lines.sort(key=lambda raw: json.loads(raw)["source"]["line"])
        self.done = {k: v for k, v in self.done.items() if k in keep_ids}
        storage.write_bytes(str(self.path), b"".join(lines))
        self._f = open(self.path, "ab")


def _summary(rec: dict[str, Any]) -> dict[str, Any]:
    regen = rec["regeneration"]
    return {"line": rec["source"]["line"], "prompt_tokens": regen["prompt_tokens"],
            "completion_tokens": regen["completion_tokens"], "requests": len(regen["turns"]),
            "truncated": bool(regen.get("truncated"))}


class ErrorLog:
    """errors.jsonl of this run: one line per conversation that is not in the output, with the reason."""

    def __init__(self, path: Path, source: str):
        self.source = source
        self._f = open(path, "wb")  # a rerun retries every failed conversation, so old errors are void
        self.count = 0

    def add(self, line: int, conv_id: str | None, reason: str, kind: str, **extra: Any) -> None:
        rec = {"file": self.source, "line": line, "id": conv_id, "kind": kind, "reason": reason, **extra}
        self._f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
        self._f.flush()
        os.fsync(self._f.fileno())
        self.count += 1

    def close(self) -> None:
        self._f.close()


def publish(local: Path, out: str, dataset: str) -> None:
    """Copy a dataset's local files to an S3 ``out`` (no-op for a local ``out``)."""
    if storage.is_s3(out):
        for name in (RECORDS, STATS, ERRORS):
            if (local / name).exists():
                storage.put_file(local / name, storage.join(out, dataset, name))


def fetch_previous(local: Path, out: str, dataset: str) -> None:
    """Resume from S3: fetch the earlier output when this machine has no local copy of it."""
    remote = storage.join(out, dataset, RECORDS)
    if storage.is_s3(out) and not (local / RECORDS).exists() and storage.exists(remote):
        storage.get_file(remote, local / RECORDS)


def write_derived_manifest(manifest: str, out: str, replaced: dict[str, str]) -> str:
    """Write ``OUT/manifest.yaml``: the input manifest with ``replaced`` datasets' sources swapped.

    ``replaced`` maps dataset name -> regenerated JSONL URI. Those entries become
    ``format: messages, regenerate: false``; all sources are absolute, since the
    new manifest lives elsewhere. Returns the URI written.
    """
    import yaml

    from eagle3.datasets.manifest import load_manifest

    entries = []
    for spec in load_manifest(manifest, check_sources=False):
        entry = {k: v for k, v in spec.to_dict().items() if v is not None}
        if spec.name in replaced:
            entry.update(source=replaced[spec.name], format="messages", regenerate=False)
        entries.append(entry)
    uri = storage.join(out, DERIVED_MANIFEST)
    storage.write_text(uri, yaml.safe_dump({"datasets": entries}, sort_keys=False))
    return uri


def completed_outputs(out: str) -> dict[str, str]:
    """Datasets under ``out`` whose stats.json says complete and within the error threshold."""
    found = {}
    for name in storage.list_files(out):
        parts = name.split("/")
        if len(parts) == 2 and parts[1] == STATS:
            stats = storage.read_json(storage.join(out, name))
            if stats.get("complete") and stats.get("passed"):
                found[parts[0]] = storage.join(out, parts[0], RECORDS)
    return found
