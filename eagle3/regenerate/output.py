"""The regenerated dataset on disk: an append-only JSONL that survives a kill.

Each finished conversation is one line, written with flush + fsync, so a
SIGKILL loses at most the conversations still in flight. On restart a torn
last line (killed mid-write) is cut off, and the conversations already present
(matched by resume key: id plus content hash, ``conversations.resume_key``) are
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
from typing import Any, Iterator

from eagle3 import storage
from eagle3.errors import InputError
from eagle3.regenerate.conversations import resume_key

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


def record_key(rec: dict[str, Any]) -> str:
    """The resume key of a finished conversation, from its provenance (``Conversation.key`` of its record)."""
    return resume_key(rec["id"], rec.get("original_messages"), rec.get("tools"))


def _made_with(rec: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec["regeneration"].items() if k in settings}


def _complete_lines(path: Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """(raw line, record) of each whole line, up to the first torn or unreadable one (a kill mid-write)."""
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                return
            try:
                yield raw, json.loads(raw)
            except json.JSONDecodeError:
                return


class RecordLog:
    """Append-only JSONL of finished conversations, keyed by resume key (``record_key``)."""

    def __init__(self, path: Path, settings: dict[str, Any], restart: bool = False):
        self.path = path
        self.settings = settings
        path.parent.mkdir(parents=True, exist_ok=True)
        if restart and path.exists():
            path.unlink()
        self.done: dict[str, dict[str, Any]] = {}  # key -> {"id", "line", "prompt_tokens", ...}, in file order
        self._load()
        self._f = open(path, "ab")

    def _load(self) -> None:
        if not self.path.exists():
            return
        good_bytes = 0  # a torn last line is dropped below, redone by this run
        for n, (raw, rec) in enumerate(_complete_lines(self.path), start=1):
            made_with = _made_with(rec, self.settings)
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
            self.done[record_key(rec)] = _summary(rec)
            good_bytes += len(raw)
        if good_bytes < self.path.stat().st_size:
            with open(self.path, "r+b") as f:
                f.truncate(good_bytes)

    def append(self, record: dict[str, Any]) -> None:
        self._f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._f.flush()
        os.fsync(self._f.fileno())
        self.done[record_key(record)] = _summary(record)

    def close(self) -> None:
        self._f.close()

    def in_order(self, lines: dict[str, int]) -> bool:
        """Whether the file holds exactly the finished ones of ``lines`` (key -> source line now), in that
        order and at those lines."""
        kept = [(k, n) for k, n in lines.items() if k in self.done]
        return [k for k, _ in kept] == list(self.done) and all(self.done[k]["line"] == n for k, n in kept)

    def rewrite(self, lines: dict[str, int]) -> None:
        """Rewrite the file in source order, keeping only the keys of ``lines`` (answers to records changed
        since an earlier run are dropped), each at its line now (a record with its own id may have moved);
        atomic, called when nothing is in flight."""
        self.close()
        kept: dict[str, bytes] = {}
        for raw in self.path.read_bytes().splitlines(keepends=True):
            rec = json.loads(raw)
            key = record_key(rec)
            if key not in lines or key in kept:
                continue
            if rec["source"]["line"] != lines[key]:
                rec["source"]["line"] = lines[key]
                raw = (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
            kept[key] = raw
        order = sorted(kept, key=lines.__getitem__)
        self.done = {k: {**self.done[k], "line": lines[k]} for k in order}
        storage.write_bytes(str(self.path), b"".join(kept[k] for k in order))
        self._f = open(self.path, "ab")


def _summary(rec: dict[str, Any]) -> dict[str, Any]:
    regen = rec["regeneration"]
    return {"id": rec["id"], "line": rec["source"]["line"], "prompt_tokens": regen["prompt_tokens"],
            "completion_tokens": regen["completion_tokens"], "requests": len(regen["turns"]),
            "truncated": bool(regen.get("truncated")),
            "at_max_tokens": sum(t.get("finish_reason") == "length" for t in regen["turns"])}


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


def fetch_previous(local: Path, out: str, dataset: str, settings: dict[str, Any]) -> None:
    """Resume from S3: merge the uploaded output into this machine's copy, by resume key.

    A retry lands on any machine: this one's copy may be older than what another uploaded since, and
    one killed before its upload holds answers S3 lacks. Both are kept (S3's first), so none is paid for
    twice and the upload at the end loses none. This copy's answers made with other settings than this
    run's are a stale cache and dropped.
    """
    remote = storage.join(out, dataset, RECORDS)
    if not storage.is_s3(out) or not storage.exists(remote):
        return
    path = local / RECORDS
    if not path.exists():
        storage.get_file(remote, path)
        return
    fetched = path.with_name(RECORDS + ".s3")
    storage.get_file(remote, fetched)
    theirs = list(_complete_lines(fetched))
    mine = [(raw, rec) for raw, rec in _complete_lines(path) if _made_with(rec, settings) == settings]
    merged: dict[str, bytes] = {}
    for raw, rec in theirs + mine:
        # Answers here made with this run's settings (a restart not uploaded yet) replace S3's made with
        # others; without such, S3's output is kept as it is and RecordLog checks its settings.
        if mine and _made_with(rec, settings) != settings:
            continue
        merged.setdefault(record_key(rec), raw)
    storage.write_bytes(str(path), b"".join(merged.values()))
    fetched.unlink()


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


def left_on_source(manifest: str, out: str, replaced: dict[str, str]) -> dict[str, str]:
    """The ``regenerate: true`` datasets of ``manifest`` not in ``replaced``: the derived manifest keeps their
    source, so tokenize of it trains on their original answers. Each with why (no output, unfinished, failed)."""
    from eagle3.datasets.manifest import load_manifest

    left = {}
    for spec in load_manifest(manifest, check_sources=False):
        if not spec.regenerate or spec.name in replaced:
            continue
        uri = storage.join(out, spec.name, STATS)
        stats = storage.read_json(uri) if storage.exists(uri) else None
        if stats is None:
            left[spec.name] = "not regenerated yet"
        elif not stats.get("complete"):
            left[spec.name] = f"unfinished: {stats.get('done')} of {stats.get('conversations')} conversations done"
        else:
            left[spec.name] = (f"{stats.get('failed')} of {stats.get('conversations')} conversations failed, "
                               "over max_error_share")
    return left


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
