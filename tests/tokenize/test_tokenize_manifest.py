"""Manifest validation: every bad entry is an InputError naming the key and the fix."""

from __future__ import annotations

import os

import pytest

from eagle3.errors import InputError
from eagle3.tokenize.manifest import DatasetSpec, load_manifest, parse_manifest


def _write(tmp_path, text: str, data: dict[str, str] | None = None) -> str:
    for name, content in (data or {"a.jsonl": '{"messages": []}\n'}).items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    m = tmp_path / "m.yaml"
    m.write_text(text)
    return str(m)


def test_relative_sources_resolve_against_manifest_folder(tmp_path, monkeypatch):
    path = _write(tmp_path, "datasets:\n  - {name: a, source: data/a.jsonl, format: messages, max_samples: 5,"
                            " category: math, drop: true}\n"
                            "  - {name: b, source: s3://bk/x/b.parquet, format: tokenized}\n",
                  {"data/a.jsonl": "{}\n"})
    monkeypatch.chdir("/")
    specs = load_manifest(path)
    assert specs[0] == DatasetSpec(name="a", source=str(tmp_path / "data/a.jsonl"), format="messages",
                                   category="math", max_samples=5, drop=True)
    assert specs[1].source == "s3://bk/x/b.parquet" and specs[1].max_samples is None
    assert DatasetSpec.from_dict(specs[0].to_dict()) == specs[0]


def test_relative_source_of_s3_manifest():
    specs = parse_manifest("datasets:\n  - {name: a, source: ../d/a.jsonl.gz, format: sharegpt}\n",
                           "s3://bk/p/q/m.yaml")
    assert specs[0].source == "s3://bk/p/d/a.jsonl.gz"


@pytest.mark.parametrize("entries, expected", [
    ("  - {name: a, source: a.jsonl, format: messages}\n  - {name: a, source: a.jsonl, format: messages}",
     "duplicates datasets[0]"),
    ("  - {name: ../x, source: a.jsonl, format: messages}", "'../x' is not allowed"),
    ("  - {name: '..', source: a.jsonl, format: messages}", "'..' is not allowed"),
    ("  - {name: a/b, source: a.jsonl, format: messages}", "'a/b' is not allowed"),
    ("  - {name: a, source: a.jsonl, format: messages, colour: red}", "unknown key(s) colour"),
    ("  - {name: a, source: a.jsonl, format: alpaca}", "'alpaca' is not a known format"),
    ("  - {name: a, source: a.csv, format: messages}", "must end with one of"),
    ("  - {name: a, source: missing.jsonl, format: messages}", "does not exist"),
    ("  - {name: a, source: empty.jsonl, format: messages}", "is empty"),
    ("  - {name: a, format: messages}", "missing required key 'source'"),
    ("  - {name: a, source: a.jsonl, format: messages, max_samples: 0}", "positive integer"),
    ("  - {name: a, source: a.jsonl, format: messages, drop: 'yes'}", "must be true or false"),
])
def test_bad_entries_are_refused(tmp_path, entries, expected):
    path = _write(tmp_path, "datasets:\n" + entries + "\n", {"a.jsonl": "{}\n", "empty.jsonl": ""})
    with pytest.raises(InputError) as e:
        load_manifest(path)
    assert expected in str(e.value)
    assert "m.yaml" in str(e.value)


@pytest.mark.parametrize("text, expected", [
    ("", "is empty"), ("datasets: []\n", "non-empty list"), ("other: 1\n", "top-level 'datasets:'"),
    ("datasets: [x]\nextra: 1\n", "unknown top-level key(s) extra"), ("datasets: [\n", "not valid YAML"),
])
def test_bad_documents_are_refused(tmp_path, text, expected):
    with pytest.raises(InputError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_manifest(_write(tmp_path, text))


def test_missing_manifest(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_manifest(os.path.join(tmp_path, "nope.yaml"))
