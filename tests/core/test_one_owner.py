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


OWNERS = {name: module for module, names in (
    # the dataset reader: manifest, file reading, record rules (roles, reasoning keys)
    ("eagle3/datasets/manifest.py", "load_manifest parse_manifest source_uris"),
    ("eagle3/datasets/readers.py", "read_records"),
    ("eagle3/datasets/records.py", "MESSAGE_ROLES SHAREGPT_ROLES REASONING_KEYS"),
    # the sample content hash, the extraction cost formula, the checksum check
    ("eagle3/datasets/samples.py", "content_id"), ("eagle3/storage_options.py", "stored_bytes"),
    ("eagle3/storage.py", "check_sha256 sha256_problem"),
    # the stage registry; a free port for a test server
    ("eagle3/stages.py", "STAGES COMMANDS"), ("eagle3/serving/process.py", "free_port"),
    # the aux-layer validator (extraction and the decoder); the OOM halving policy (extraction and training)
    ("eagle3/target.py", "resolve_aux_layers"), ("eagle3/oom.py", "halved_budget"),
    # one renderer of a run's summary: the number formatter, the engine rows and verdicts, the task outcome;
    # the content read from a run's files (report.json's and the UI tab's); the texts and tables both pages print
    ("eagle3/report/summary.py", "fmt_metric headline_rows lossless_text tie_flips run_status"),
    ("eagle3/report/collect.py", "collect task_results reuse_of task_state_map read_datasets read_training "
                                 "read_extraction training_curves"),
    ("eagle3/report/view.py", "sections SECTION_TASKS dataset_columns reuse_lines"),
    ("eagle3/report/html.py", "render_html"),
    # the hidden-state store's file rules (writer, reader, online write-back, the report, the storage bench)
    ("eagle3/extract/store_format.py", "store_key read_indexes resolve_store_dir is_index_name IDENTITY"),
    # the TTT defaults, torch-free (train's config and the trainer import them, not eagle3.draft.ttt)
    ("eagle3/draft/config.py", "DEFAULT_TTT_LENGTH DEFAULT_STEP_DECAY"),
    # the trainer's sample interface (the store reader and the online source implement it)
    ("eagle3/train/source.py", "SampleSource"),
    # where greedy outputs first differ (the lossless verdict; the vLLM states file's token check)
    ("eagle3/evaluate/lossless.py", "first_difference"),
    # the prompt-lookup rule (the decoder's lookup+draft proposer and the copy bench's simulation)
    ("eagle3/evaluate/lookup.py", "prompt_lookup PROPOSERS"),
    # a model folder's tokenizer files (the fingerprint hashes them; the tests' tiny Llamas copy them)
    ("eagle3/target.py", "TOKENIZER_FILES"), ("tests/tiny_llama.py", "save_random_llama"),
    # the argv of an `eagle3 <stage>` child (operators) and the benches' way of running one
    ("operators/supervised.py", "eagle3_cli"), ("bench/stage_process.py", "run_stage"),
    # the extract engines: which exist, which are served, what a top-k-only engine refuses; the served engines'
    # shared lifecycle, checks and factory; SGLang's flags, request and module; a server log's last error line;
    # the capture draft; the codec's ready top-k
    ("eagle3/extract/config.py", "ENGINES SERVED_ENGINES check_engine_storage_option"),
    ("eagle3/extract/served.py", "served_capture check_states package_version"),
    ("eagle3/serving/sglang.py", "HIDDEN_STATE_FLAGS states_request default_module"),
    ("eagle3/serving/process.py", "last_error_line _ERROR_LINE"),
    ("eagle3/export.py", "write_capture_draft"), ("eagle3/extract/codec.py", "TopK"),
    # one name per concept: the table of renamed keys and the one reader of old names (Config JSON and kwargs,
    # the command line, a draft checkpoint); store.json's reader
    ("eagle3/config.py", "RENAMED renamed_keys renamed_fields deprecated"),
    ("eagle3/extract/store_format.py", "read_store_json upgraded_store_json"),
) for name in names.split()}
RETIRED = ("sample_id", "_free_port", "_stats_with_table", "_publish_and_say", "_evaluate_and_say", "stage_cli",
           # the aux layers' and the storage option's other names (eagle3.config.RENAMED)
           "trained_aux_layer_ids", "engine_aux_layer_ids", "check_engine_storage", "LAYERS",
           # the report stage's and the UI tab's own readers of a run's files, before eagle3.report.collect
           "read_acceptance", "_task_results", "_reuse", "_read_json", "dataset_rows", "store_dir",
           # the vllm engine's own version probe and answer error, before eagle3.extract.served
           "vllm_version", "VLLMAnswerError",
           # the vLLM states file's own first difference, before eagle3.evaluate.lossless's
           "_first_difference")


@pytest.mark.parametrize("name, owner", sorted(OWNERS.items()))
def test_each_fact_has_one_owner(name, owner):
    assert _defined(name) == [owner]


def test_retired_copies_stay_gone():
    assert {name: _defined(name) for name in RETIRED} == {name: [] for name in RETIRED}
    assert sorted((REPO / "eagle3").glob("*/cli.py")) == []  # the stage shims: eagle3.stages wires the CLI


@pytest.mark.parametrize("pattern, owner", [
    (r"yaml\.(safe_)?load\(", "eagle3/datasets/manifest.py"),  # the manifest is parsed in one place
    # the stage folders' file names (eagle3/layout.py)
    (r"""["'](report\.json|train\.parquet|tokenized\.parquet|verify\.json|manifest\.json)["']""", "eagle3/layout.py"),
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
    (r"""["']EAGLE3_SGLANG_MODULE["']""", "eagle3/serving/sglang.py"),  # the fake-SGLang switch
    (r"""["']--enable-return-hidden-states["']""", "eagle3/serving/sglang.py"),  # the engine's flags
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


OLD_NAMES = ("storage", "layers", "aux_layer_ids")
"""The storage option's and the aux layers' old names: only eagle3.config.RENAMED spells them as a key."""
OTHER_CONCEPTS = {
    ("eagle3/memory.py", "layers"),  # the decoder layers' parameter count, not the aux layers
    ("eagle3/extract/lean_llama.py", "layers"),  # the lean forward's decoder layers
    ("eagle3/demo/code_tasks.py", "layers"), ("eagle3/demo/corpus.py", "storage"),  # words of the demo corpus
}


def test_the_storage_option_and_the_aux_layers_have_one_name_in_every_layer():
    """No Config field, attribute, argument, JSON key or CLI flag of the product or the benches uses an old
    name: ``storage_option`` and ``aux_layers`` from the DAG's Params to the Configs, the CLI and the files
    written (the old names are read through eagle3.config.RENAMED alone)."""
    from eagle3.config import RENAMED

    assert {old: RENAMED[old] for old in OLD_NAMES} == {"storage": "storage_option", "layers": "aux_layers",
                                                        "aux_layer_ids": "aux_layers"}
    found = []
    for path in _files(CODE + ("bench",)):
        where, text = str(path.relative_to(REPO)), path.read_text()
        for node in ast.walk(ast.parse(text, where)):
            if isinstance(node, ast.ClassDef):  # a dataclass field or a Protocol member
                names = [s.target.id for s in node.body
                         if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names = [node.attr]
            elif isinstance(node, ast.keyword):
                names = [node.arg]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
            elif isinstance(node, ast.Constant) and where != "eagle3/config.py":  # a JSON key, a Config key
                names = [node.value]
            else:
                continue
            found += [f"{where}:{node.lineno} {n}" for n in names
                      if n in OLD_NAMES and (where, n) not in OTHER_CONCEPTS]
        found += [f"{where}: {m}" for m in re.findall(r"--(?:storage|layers|aux-layer-ids)(?![-\w])", text)]
    assert found == []
