"""The compose topology as real processes: PostgreSQL + Redis + CeleryExecutor,
api-server, scheduler, dag-processor, a worker on queues default and gpu, and a
moto S3 artifact store. A run is triggered through the REST API and polled."""

from __future__ import annotations

import time

import httpx
import pytest

from eagle3 import storage
from eagle3.memory import GPU_MEMORY_ENV
from tests.airflow.cluster import Cluster
from tests.airflow.tiny_data import tiny_conf, write_tiny_manifest

pytestmark = [pytest.mark.integration]


@pytest.fixture
def cluster(tmp_path, s3_endpoint):
    # Under the CeleryExecutor the gate cannot measure queue gpu's devices (eagle3.verify.sizing): the deployment
    # names one's memory, as docs/cluster.md says; here queue gpu's worker is this machine's CPU.
    c = Cluster(tmp_path / "airflow", s3_endpoint, extra_env={"EAGLE3_RETRY_DELAY_S": "2", GPU_MEMORY_ENV: "8"})
    c.start()
    yield c
    c.stop()


def test_triggered_run_succeeds_with_artifacts_in_s3(cluster, tmp_path, s3_bucket, tiny_llama_dir):
    manifest = write_tiny_manifest(tmp_path / "data")
    root = f"{s3_bucket}/eagle3"
    headers = {"Authorization": f"Bearer {cluster.token()}"}
    api = f"{cluster.base_url}/api/v2"
    # The api-server shares 2 cores with a worker training a draft: allow slow answers, retry a timed-out poll.
    client = httpx.Client(headers=headers, timeout=60)

    def get(url: str, **kw) -> httpx.Response:
        for attempt in range(3):
            try:
                return client.get(url, **kw)
            except httpx.TimeoutException:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    deadline = time.time() + 180
    while get(f"{api}/dags/eagle3_train").status_code != 200:
        assert time.time() < deadline, cluster.logs("dag-processor")
        time.sleep(2)
    client.patch(f"{api}/dags/eagle3_train", json={"is_paused": False}).raise_for_status()
    r = client.post(f"{api}/dags/eagle3_train/dagRuns",
                    json={"logical_date": None, "conf": tiny_conf(manifest, tiny_llama_dir, root)})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]

    deadline = time.time() + 900
    state = None
    while time.time() < deadline:
        state = get(f"{api}/dags/eagle3_train/dagRuns/{run_id}").json()["state"]
        if state in ("success", "failed"):
            break
        time.sleep(5)
    tis = get(f"{api}/dags/eagle3_train/dagRuns/{run_id}/taskInstances",
              params={"limit": 100}).json()["task_instances"]
    summary = {(t["task_id"], t["map_index"]): (t["state"], t["pool"], t["queue"]) for t in tis}
    spans = sorted((t["start_date"], t["end_date"]) for t in tis if t["task_id"] == "extract")
    assert state == "success", (summary, cluster.logs("worker"), cluster.logs("scheduler"))

    # mapped extraction ran in pool gpu on queue gpu, one instance per shard
    extract = {k: v for k, v in summary.items() if k[0] == "extract"}
    assert sorted(i for _, i in extract) == [0, 1]
    assert all(v == ("success", "gpu", "gpu") for v in extract.values()), extract
    assert summary[("tokenize", 0)][0] == "success" and summary[("tokenize", 1)][0] == "success"
    # pool gpu has one slot: the worker (concurrency 2) never ran the two shards at once
    assert spans[0][1] <= spans[1][0], spans

    # artifacts landed in S3
    run_files = storage.list_files(f"{root}/runs/eagle3_train/{run_id}")
    for expected in ("merged/train.parquet", "merged/verify.json", "vocab/vocab.safetensors",
                     "draft/config.json", "draft/model.safetensors", "eval/report.json"):
        assert expected in run_files, (expected, run_files)
    store_files = storage.list_files(f"{root}/store")
    assert any(f.endswith(".safetensors") for f in store_files), store_files
    assert storage.read_json(f"{root}/runs/eagle3_train/{run_id}/merged/verify.json")["passed"] is True
