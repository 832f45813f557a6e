"""Manifest validation: every bad entry is an InputError naming the key and the fix."""

from __future__ import annotations

import os

import pytest

from eagle3.datasets.manifest import DatasetSpec, load_manifest, parse_manifest
from eagle3.errors import InputError


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
    # YAML keeps the last of a repeated key silently; a manifest refuses it
    ("datasets:\n- name: a\n  format: messages\n  format: sharegpt\n",
     "key 'format' given twice (first on line 3)"),
])
def test_bad_documents_are_refused(tmp_path, text, expected):
    with pytest.raises(InputError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_manifest(_write(tmp_path, text))


def test_missing_manifest(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_manifest(os.path.join(tmp_path, "nope.yaml"))


# --- odd YAML: an InputError naming the manifest, never a traceback or a hang (issue 15) --------------------------
def _alias_bomb(levels: int = 8) -> str:
    """A YAML flow list whose repr holds 9**levels items: each level lists the previous one 9 times."""
    parts = ["&a0 [" + ", ".join(["x"] * 9) + "]"]
    parts += [f"&a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, levels + 1)]
    return "[" + ", ".join(parts) + "]"


@pytest.mark.parametrize("text, expected", [
    ("datasets:\n  - " + "[" * 1000 + "]" * 1000 + "\n", "nested too deeply"),  # was RecursionError
    ("datasets:\n  - {name: a, source: a.jsonl, format: messages, 1: x, zz: 2}\n", r"unknown key\(s\) 1, zz"),
    ("datasets: [x]\n1: 2\nzz: 3\n", r"unknown top-level key\(s\) 1, zz"),  # was TypeError in sorted()
    ("datasets:\n  - {name: [a], source: a.jsonl, format: messages}\n", "dataset name a list is not allowed"),
    ("datasets:\n  - {name: a, source: a.jsonl, format: {x: 1}}\n", "format: a dict is not a known format"),
    ("datasets:\n  - {name: a, source: a.jsonl, format: messages, category: [math]}\n", "category: a list"),
])
def test_odd_yaml_is_refused(tmp_path, text, expected):
    with pytest.raises(InputError, match=expected) as e:
        load_manifest(_write(tmp_path, text))
    assert "m.yaml" in str(e.value)


@pytest.mark.timeout(30)
def test_an_alias_bomb_is_not_expanded_into_the_error(tmp_path):
    # the error used to repr the value: 9**8 items, minutes and gigabytes
    text = f"datasets:\n  - {{name: a, source: a.jsonl, format: {_alias_bomb()}}}\n"
    with pytest.raises(InputError, match="format: a list is not a known format"):
        parse_manifest(text, str(tmp_path / "m.yaml"), check_sources=False)


def test_a_folder_is_not_a_manifest(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(InputError, match="is a folder"):
        load_manifest(str(tmp_path / "m"))


def test_yaml_anchors_and_merge_keys_still_work_beside_the_repeated_key_check(tmp_path):
    path = _write(tmp_path, "datasets:\n  - &a {name: a, source: a.jsonl, format: messages, category: chat}\n"
                            "  - <<: *a\n    name: b\n")
    assert [(s.name, s.format, s.category) for s in load_manifest(path)] == [("a", "messages", "chat"),
                                                                          ("b", "messages", "chat")]
