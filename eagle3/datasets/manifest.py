"""The dataset manifest: a YAML file with a top-level ``datasets:`` list.

    datasets:
      - name: arithmetic            # [A-Za-z0-9_.-]+, unique; used as a folder name
        source: data/arith.jsonl    # local (relative to the manifest's folder) or s3://
        format: messages            # messages | sharegpt | tokenized
        category: math              # optional
        max_samples: 1000           # optional
        drop: false                 # optional: left out at merge
        regenerate: false           # optional: regenerate assistant turns first

The one owner of the manifest: every stage (discover, regenerate, tokenize, merge) and the
DAG's Asset list (``source_uris``) read it here, with one rule for relative sources.

``load_manifest(path)`` validates everything it can without reading the data:
unknown keys, bad or duplicate names, names that would escape the output folder,
unknown formats and file types, and local sources that are missing or empty.
Every error names the manifest, the dotted key and the fix. Values are type-checked
before use and shown with ``describe`` (never a full repr: YAML aliases can make a
value exponentially large), and YAML nested too deep for the parser is an InputError.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from eagle3 import storage
from eagle3.errors import InputError
from eagle3.datasets.describe import describe

log = logging.getLogger(__name__)

FORMATS = ("messages", "sharegpt", "tokenized")
EXTENSIONS = (".jsonl", ".jsonl.gz", ".parquet")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class DatasetSpec:
    """One entry of the manifest, with ``source`` already resolved."""

    name: str
    """Unique name, also the folder name under the prepared folder."""
    source: str
    """Absolute local path or ``s3://`` URI of a .jsonl, .jsonl.gz or .parquet file."""
    format: str
    """``messages`` | ``sharegpt`` | ``tokenized``."""
    category: str | None = None
    """Free text used in reports (e.g. ``math``)."""
    max_samples: int | None = None
    """Keep at most this many samples (the first ones in file order)."""
    drop: bool = False
    """Left out at merge (still tokenized, so stats show what was dropped)."""
    regenerate: bool = False
    """Replace assistant turns with the target's own answers before tokenizing."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DatasetSpec":
        from eagle3.config import from_dict

        return from_dict(cls, data, where="dataset")


_KEYS = {f.name for f in dataclasses.fields(DatasetSpec)}


def source_extension(source: str) -> str | None:
    """The accepted extension ``source`` ends with, or None."""
    low = source.lower()
    return next((ext for ext in EXTENSIONS if low.endswith(ext)), None)


def check_name(name: Any, where: str) -> str:
    """A dataset name that is safe as one folder name (no ``/``, no ``..``)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise InputError(
            f"{where}: dataset name {describe(name)} is not allowed; use letters, digits, '_', '-' and '.' only "
            "(it becomes a folder name, so '/', '..' and empty names are refused), e.g. name: arithmetic"
        )
    return name


def _unknown_keys(mapping: dict, known: set[str]) -> list[str]:
    """Keys not in ``known``, sorted and shown as text (YAML keys may be numbers, dates or null)."""
    return sorted(describe(k) if not isinstance(k, str) else k for k in mapping if k not in known)


def _resolve_source(source: str, manifest_uri: str) -> str:
    if storage.is_s3(source) or os.path.isabs(source):
        return source
    if storage.is_s3(manifest_uri):
        base = manifest_uri.rsplit("/", 1)[0]
        bucket_prefix = "s3://" + storage.split_s3(base)[0]
        key_dir = base[len(bucket_prefix):].lstrip("/")
        return f"{bucket_prefix}/{posixpath.normpath(posixpath.join(key_dir, source))}"
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(manifest_uri)), source))


def _check_entry(entry: Any, i: int, manifest: str, check_sources: bool) -> DatasetSpec:
    where = f"{manifest}: datasets[{i}]"
    if not isinstance(entry, dict):
        raise InputError(f"{where} must be a mapping with name, source and format; got {describe(entry)}")
    unknown = _unknown_keys(entry, _KEYS)
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(_KEYS))}"
        )
    for key in ("name", "source", "format"):
        if entry.get(key) in (None, ""):
            raise InputError(f"{where}: missing required key {key!r} (each dataset needs name, source, format)")
    name = check_name(entry["name"], f"{where}.name")
    where = f"{manifest}: datasets[{i}] ({name})"
    fmt = entry["format"]
    if fmt not in FORMATS:
        raise InputError(f"{where}.format: {describe(fmt)} is not a known format; use one of {', '.join(FORMATS)}")
    source = entry["source"]
    if not isinstance(source, str):
        raise InputError(f"{where}.source: expected a path or s3:// URI, got {describe(source)}")
    if source_extension(source) is None:
        raise InputError(f"{where}.source: {source!r} must end with one of {', '.join(EXTENSIONS)}")
    source = _resolve_source(source, manifest)
    if check_sources and not storage.is_s3(source):
        if not os.path.isfile(source):
            raise InputError(f"{where}.source: file {source} does not exist (relative paths are resolved "
                             f"against the manifest's folder)")
        if os.path.getsize(source) == 0:
            raise InputError(f"{where}.source: file {source} is empty")
    max_samples = entry.get("max_samples")
    if max_samples is not None and (isinstance(max_samples, bool) or not isinstance(max_samples, int)
                                    or max_samples < 1):
        raise InputError(f"{where}.max_samples: {describe(max_samples)} must be a positive integer (or left out)")
    for key in ("drop", "regenerate"):
        if not isinstance(entry.get(key, False), bool):
            raise InputError(f"{where}.{key}: {describe(entry[key])} must be true or false")
    category = entry.get("category")
    if isinstance(category, (list, dict)):  # scalars (2024, a date) are taken as their text
        raise InputError(f"{where}.category: {describe(category)} must be text, e.g. category: math")
    if category is not None:
        category = str(category)
    return DatasetSpec(name=name, source=source, format=fmt, category=category, max_samples=max_samples,
                       drop=entry.get("drop", False), regenerate=entry.get("regenerate", False))


def _unique_keys_loader():
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML itself keeps the last silently)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: merged by the base class
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    line = first.setdefault(key, key_node.start_mark.line)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if line != key_node.start_mark.line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {line + 1}); keep one",
                        key_node.start_mark)
            return super().construct_mapping(node, deep)

    return UniqueKeys


def parse_manifest(text: str, manifest: str = "<manifest>", check_sources: bool = True) -> list[DatasetSpec]:
    """Validate manifest YAML ``text``; ``manifest`` names it in errors and anchors relative sources."""
    import yaml

    try:
        doc = yaml.load(text, Loader=_unique_keys_loader())  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise InputError(f"{manifest}: not valid YAML: {e}") from None
    except RecursionError:  # PyYAML composes recursively
        raise InputError(f"{manifest}: YAML nested too deeply to parse; a manifest is a list of flat entries") \
            from None
    if doc is None:
        raise InputError(f"{manifest}: the manifest is empty; it needs a top-level 'datasets:' list")
    if not isinstance(doc, dict) or "datasets" not in doc:
        raise InputError(f"{manifest}: expected a top-level 'datasets:' list, got {type(doc).__name__}")
    unknown = _unknown_keys(doc, {"datasets"})
    if unknown:
        raise InputError(f"{manifest}: unknown top-level key(s) {', '.join(unknown)}; only 'datasets' is allowed")
    entries = doc["datasets"]
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{manifest}: 'datasets' must be a non-empty list of datasets")
    specs = [_check_entry(e, i, manifest, check_sources) for i, e in enumerate(entries)]
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise InputError(f"{manifest}: datasets[{i}].name {spec.name!r} duplicates datasets[{seen[spec.name]}]; "
                             "dataset names must be unique (they are folder names)")
        seen[spec.name] = i
    return specs


def load_manifest(path: str, check_sources: bool = True) -> list[DatasetSpec]:
    """Read and validate the manifest at ``path`` (local or ``s3://``).

    Relative sources are resolved against the manifest's folder. With
    ``check_sources`` local source files must exist and be non-empty (S3
    sources are checked when they are read).
    """
    path = str(path)
    if not storage.exists(path):
        raise InputError(f"manifest {path} does not exist")
    try:
        text = storage.read_text(path)
    except UnicodeDecodeError as e:
        raise InputError(f"manifest {path} is not UTF-8 text: {e}") from None
    except IsADirectoryError:
        raise InputError(f"manifest {path} is a folder; give the YAML file inside it") from None
    return parse_manifest(text, path, check_sources)


def source_uris(path: str) -> list[tuple[str, str]]:
    """(name, URI) of each dataset source of the local manifest at ``path``: what the DAG's Asset list
    watches. Light enough for DAG parse time: it reads only the YAML (no source is checked, nothing is
    fetched), and a manifest that is on S3, missing or invalid gives [] (the discover task then says what
    is wrong). A local source is a ``file://`` URI of the path every stage reads."""
    path = str(path)
    if storage.is_s3(path) or not os.path.isfile(path):
        return []
    try:
        specs = load_manifest(path, check_sources=False)
    except InputError as e:
        log.warning("no dataset Assets: %s", e)
        return []
    return [(s.name, s.source if storage.is_s3(s.source) else f"file://{s.source}") for s in specs]
