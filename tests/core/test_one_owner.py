"""One owner per fact: each fact below is defined in exactly one module, found by scanning the source.

A second definition (a copy that may drift) or a hand-written second version of the formula
fails here with the places to merge.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODE = ("eagle3", "dags", "operators", "plugins")  # the product; tests and benches import it


def _files(roots=CODE + ("tests", "bench")) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py"))


@functools.lru_cache(maxsize=1)
def _definitions() -> dict[str, set[str]]:
    """name -> the files that define it at any level (def, class or assignment)."""
    found: dict[str, set[str]] = {}
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def _defined(name: str) -> list[str]:
    return sorted(_definitions().get(name, ()))


OWNERS = {
    # the dataset reader: manifest, file reading, record rules (roles, reasoning keys)
    "load_manifest": "eagle3/datasets/manifest.py", "parse_manifest": "eagle3/datasets/manifest.py",
    "source_uris": "eagle3/datasets/manifest.py", "read_records": "eagle3/datasets/readers.py",
    "MESSAGE_ROLES": "eagle3/datasets/records.py", "SHAREGPT_ROLES": "eagle3/datasets/records.py",
    "REASONING_KEYS": "eagle3/datasets/records.py",
    # the sample content hash, the extraction cost formula, the checksum check
    "content_id": "eagle3/datasets/samples.py", "stored_bytes": "eagle3/storage_options.py",
    "check_sha256": "eagle3/storage.py", "sha256_problem": "eagle3/storage.py",
    # the stage registry; a free port for a test server
    "STAGES": "eagle3/stages.py", "COMMANDS": "eagle3/stages.py", "free_port": "eagle3/serving/process.py",
    # the aux-layer validator (extraction and the decoder); the OOM halving policy (extraction and training)
    "aux_layers": "eagle3/target.py", "halved_budget": "eagle3/oom.py",
    # one renderer of a run's summary: the number formatter, the engine rows and verdicts, the task outcome
    # (summary.py); the content read from a run's files (collect.py: report.json's and the UI tab's); the texts
    # and tables both pages print (view.py)
    "fmt_metric": "eagle3/report/summary.py", "headline_rows": "eagle3/report/summary.py",
    "lossless_text": "eagle3/report/summary.py", "tie_flips": "eagle3/report/summary.py",
    "run_status": "eagle3/report/summary.py",
    "collect": "eagle3/report/collect.py", "task_results": "eagle3/report/collect.py",
    "reuse_of": "eagle3/report/collect.py", "task_state_map": "eagle3/report/collect.py",
    "read_datasets": "eagle3/report/collect.py", "read_training": "eagle3/report/collect.py",
    "read_extraction": "eagle3/report/collect.py", "training_curves": "eagle3/report/collect.py",
    "sections": "eagle3/report/view.py", "SECTION_TASKS": "eagle3/report/view.py",
    "dataset_columns": "eagle3/report/view.py", "reuse_lines": "eagle3/report/view.py",
    "render_html": "eagle3/report/html.py",
    # the hidden-state store's file rules (writer, reader, online write-back, the UI's report tab)
    "store_key": "eagle3/extract/store_format.py", "read_indexes": "eagle3/extract/store_format.py",
    "resolve_store_dir": "eagle3/extract/store_format.py", "is_index_name": "eagle3/extract/store_format.py",
    "IDENTITY": "eagle3/extract/store_format.py",
    # the TTT defaults, torch-free (train's config and the trainer import them, not eagle3.draft.ttt)
    "DEFAULT_TTT_LENGTH": "eagle3/draft/config.py", "DEFAULT_STEP_DECAY": "eagle3/draft/config.py",
    # the trainer's sample interface (the store reader and the online source implement it)
    "SampleSource": "eagle3/train/source.py",
    # where greedy outputs first differ (the lossless verdict; eagle3/extract/vllm_states.py keeps a torch
    # `_first_difference` of its own for now)
    "first_difference": "eagle3/evaluate/lossless.py",
    # a model folder's tokenizer files (the fingerprint hashes them; the tests' tiny Llamas copy them)
    "TOKENIZER_FILES": "eagle3/target.py", "save_random_llama": "tests/tiny_llama.py",
    # the argv of an `eagle3 <stage>` child (operators) and the benches' way of running one
    "eagle3_cli": "operators/supervised.py", "run_stage": "bench/stage_process.py",
}
RETIRED = ("sample_id", "_free_port", "_stats_with_table", "_publish_and_say", "_evaluate_and_say", "stage_cli",
           # the report stage's and the UI tab's own readers of a run's files, before eagle3.report.collect
           "read_acceptance", "_task_results", "_reuse", "_read_json", "dataset_rows", "store_dir")


@pytest.mark.parametrize("name, owner", sorted(OWNERS.items()))
def test_each_fact_has_one_owner(name, owner):
    assert _defined(name) == [owner]


def test_retired_copies_stay_gone():
    assert {name: _defined(name) for name in RETIRED} == {name: [] for name in RETIRED}
    assert sorted((REPO / "eagle3").glob("*/cli.py")) == []  # the stage shims: eagle3.stages wires the CLI


@pytest.mark.parametrize("pattern, owner", [
    (r"yaml\.safe_load\(", "eagle3/datasets/manifest.py"),  # the manifest is parsed in one place
    (r"""dtype=["']<i4["']\)\.tobytes\(\)""", "eagle3/datasets/samples.py"),  # the content hash's bytes
    (r"\bOFFSET_BYTES \*", "eagle3/storage_options.py"),  # offsets are priced by the formula only
    (r"""["']bing["']""", "eagle3/datasets/records.py"),  # role aliases
    (r"sha256_(file|bytes)\(.*\)\)? *!= *\w", None),  # a digest compared by hand: storage.sha256_problem does it
    (r"(budget|tokens|micro\w*) // 2\b", "eagle3/oom.py"),  # halving a token budget after an OOM
    (r"(?m)^[^#\n]*\b0\.8 \*\*", None),
    (r":,\.4g\}", "eagle3/report/summary.py"),  # 4 significant digits: the one number formatter
    (r"""f?["'](index|shard|adapt)-(\{|["'])""", "eagle3/extract/store_format.py"),  # the store's file names
    (r"""["']store\.json["']""", "eagle3/extract/store_format.py"),  # the store's identity file
    (r"ttt_length: int = \d", None),  # the TTT length default is DEFAULT_TTT_LENGTH
    (r"""["']-m["'], *["']eagle3\.cli["']""", "operators/supervised.py"),  # an `eagle3 <stage>` child's argv
])
def test_a_formula_is_written_once(pattern, owner):
    places = [str(p.relative_to(REPO)) for p in _files(CODE + ("bench",)) if re.search(pattern, p.read_text())]
    assert places == ([owner] if owner else []), places


def test_the_tokenizer_files_are_named_once():
    """Which files of a model folder are its tokenizer: eagle3.target.TOKENIZER_FILES (tests copy them through
    tests/tiny_llama.py)."""
    places = [str(p.relative_to(REPO)) for p in _files()
              if re.search(r"""startswith\(["']tokenizer["']\)|["']special_tokens_map\.json["']""", p.read_text())]
    assert places == ["eagle3/target.py"], places


def test_both_report_pages_print_what_eagle3_report_view_formats():
    """report.html and the UI's template lay out eagle3.report.view's cells and texts: neither formats a figure
    itself, so the same run reads the same on both (tests/plugins/test_one_renderer.py compares the pages)."""
    formatting = [str(p.relative_to(REPO)) for p in _files(CODE) if re.search(r"\bfmt(_metric)?\(", p.read_text())]
    assert formatting == ["eagle3/report/summary.py", "eagle3/report/view.py"], formatting
    template = (REPO / "plugins" / "eagle3_report" / "templates" / "report.html.j2").read_text()
    assert re.findall(r"\|\s*(?:fmt|format|round)\b|%\.?\d*[dfg]", template) == []
    # the run's files are read by eagle3.report.collect, not by the page or the renderer
    readers = [str(p.relative_to(REPO)) for p in _files(("plugins", "eagle3/report"))
               if re.search(r"""["'](publish|verify|sglang_report|stats_table)\.json["']|read_metrics\(""",
                            p.read_text())]
    assert readers == ["eagle3/report/collect.py"], readers
