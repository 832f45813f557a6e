"""The whole DAG with ``target_engine=vllm`` through real `airflow dags test`, offline and online, on a tiny
random Llama that vLLM's CPU attention accepts (head size 32; the suite's tiny Llama has 16).

Offline: the one extract task serves the target in vLLM's extraction mode and writes the store, which records
the vllm engine; train reads it. Online: extract maps over no shard and train gets every micro-batch from a
vLLM server it starts and stops. Kept small: 20 samples, one shard, two steps, two vLLM starts in all (the
online run gets a storage root of its own, or it would find the offline store and compute nothing).
"""

from __future__ import annotations

import json

import pytest

from eagle3.errors import InputError
from tests.airflow.test_dags_test_runs import dags_test, newest_run_dir, task_instances
from tests.airflow.tiny_data import tiny_conf, write_tiny_manifest
from tests.tiny_llama import save_random_llama, tiny_llama_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_tiny_llama(tmp_path_factory, smollm2_dir) -> str:
    from eagle3.serving.vllm import vllm_python

    try:
        vllm_python()
    except InputError as e:
        pytest.skip(f"no vLLM venv: {e}")
    return save_random_llama(tmp_path_factory.mktemp("tiny-llama-hd32"),
                             tiny_llama_config(num_attention_heads=2, num_key_value_heads=1), smollm2_dir)


def test_dag_with_the_vllm_engine_offline_then_online(airflow_home, tmp_path, vllm_tiny_llama):
    manifest = write_tiny_manifest(tmp_path / "data", n_per_dataset=10)
    root = tmp_path / "artifacts"
    conf = tiny_conf(manifest, vllm_tiny_llama, str(root), extract_shards=1, max_steps=2, target_engine="vllm",
                     precision="float32")
    proc = dags_test(airflow_home, conf)
    tis = task_instances(airflow_home)
    assert tis[("extract", 0)][0] == "success" and tis[("train", -1)][0] == "success", (tis, proc.stdout[-3000:])
    assert tis[("outcome", -1)][0] == "success", (tis, proc.stdout[-3000:])
    store = json.loads(next((root / "store").rglob("store.json")).read_text())
    assert store["engine"]["name"] == "vllm", store

    online_root = tmp_path / "online-artifacts"
    proc = dags_test(airflow_home, {**conf, "storage_root": str(online_root), "training_mode": "online"})
    tis = task_instances(airflow_home)
    assert tis[("train", -1)][0] == "success" and tis[("outcome", -1)][0] == "success", (tis, proc.stdout[-3000:])
    assert not [k for k in tis if k[0] == "extract" and tis[k][0] == "success"], tis
    summary = json.loads((newest_run_dir(online_root) / "summaries" / "train.json").read_text())
    assert summary["mode"] == "online" and summary["online"]["engine"] == "vllm", summary
    assert summary["online"]["samples_computed"] > 0
