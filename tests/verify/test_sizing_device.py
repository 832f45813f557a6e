"""Which device the gate's memory check sizes (eagle3/verify/sizing.py): in the cluster it runs on a CPU worker
while training and extraction run on the gpu queue's workers, so this worker's RAM is not their memory; and the
weights it counts come from the checkpoint's index where there is one."""

from __future__ import annotations

import json

import pytest

from eagle3 import memory
from eagle3.devices import PRECISION_ENV, cpu_flags, cpu_precision
from eagle3.verify import VerifyConfig, verify
from tests.verify.test_sizing import LLAMA_70B, SMOL, target
from tests.verify.test_verify import failed_checks, merged  # noqa: F401  (the fixture)


@pytest.fixture
def big_cpu_worker(monkeypatch):
    """A CPU worker with 512 GiB of RAM and no GPU (what the gate measured in the cluster); a given size wins."""
    real = memory.device_memory
    monkeypatch.setattr(memory, "device_memory", lambda gib=None: real(gib) if gib else (512 * memory.GiB, "cpu"))


def test_a_cpu_worker_refuses_to_size_the_gpu_queues_devices(tmp_path, merged, big_cpu_worker):  # noqa: F811
    """512 GiB of RAM passed Llama-3-70B with target_engine=transformers, and every extract shard then died on
    an 80 GB GPU."""
    model = target(tmp_path, LLAMA_70B, "llama70b")
    failed, msg, checks = failed_checks(merged, model=model, target_engine="transformers", devices_elsewhere=True)
    assert failed == {"memory"} and "not sized" in msg
    assert "device_memory_gib" in msg and memory.GPU_MEMORY_ENV in msg
    assert checks["memory"]["device"] == "cpu"


def test_given_the_gpus_memory_it_sizes_a_cuda_device(tmp_path, merged, big_cpu_worker, monkeypatch):  # noqa: F811
    model = target(tmp_path, LLAMA_70B, "llama70b")
    monkeypatch.delenv(PRECISION_ENV, raising=False)
    failed, msg, checks = failed_checks(merged, model=model, target_engine="transformers", devices_elsewhere=True,
                                        device_memory_gib=80)
    mem = checks["memory"]
    assert (mem["device"], mem["precision"], mem["device_memory"]) == ("cuda", "bfloat16", 80 * memory.GiB)
    assert failed == {"memory"} and "target_tensor_parallel_size=2" in msg  # 141 GB of bf16 weights
    # A GPU known by its memory alone is taken for sm80+, unless $EAGLE3_PRECISION says what auto resolves to.
    monkeypatch.setenv(PRECISION_ENV, "float32")
    ok = verify(VerifyConfig(merged, model=target(tmp_path, SMOL, "smol"), devices_elsewhere=True,
                             device_memory_gib=80))
    assert {c["name"]: c for c in ok["checks"]}["memory"]["precision"] == "float32"


def test_where_every_task_runs_here_this_machine_is_sized(tmp_path, merged, big_cpu_worker, monkeypatch):  # noqa: F811
    """The demo (`airflow dags test`, the Local executor): the gate's machine is the training machine, sized in the
    precision training resolves there ($EAGLE3_PRECISION first, as eagle3.devices.resolve_precision; the CPU's
    flags alone would pick the other one)."""
    forced = "float32" if cpu_precision(cpu_flags())[0] == "bfloat16" else "bfloat16"
    monkeypatch.setenv(PRECISION_ENV, forced)
    result = verify(VerifyConfig(merged, model=target(tmp_path, SMOL, "smol")))
    mem = {c["name"]: c for c in result["checks"]}["memory"]
    assert mem["passed"] and (mem["device"], mem["precision"]) == ("cpu", forced)
    assert mem["device_memory"] == 512 * memory.GiB


def test_the_checkpoints_index_gives_the_weights(tmp_path, merged):  # noqa: F811
    """A folder with model.safetensors.index.json: its total_size is the weights the gate splits over the ranks."""
    model = target(tmp_path, LLAMA_70B, "llama70b")
    total = 141_107_412_992
    (tmp_path / "llama70b" / memory.INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}}))
    result = verify(VerifyConfig(merged, model=model, target_engine="vllm", tensor_parallel_size=4,
                                 device_memory_gib=80))
    mem = {c["name"]: c for c in result["checks"]}["memory"]
    assert mem["extraction"]["weights"]["bytes"] == total and mem["extraction"]["parts"]["weights"] == total // 4
    assert f"from {memory.INDEX_FILE}" in mem["detail"]
