"""The vllm engine without vLLM: layer ids, the states -> aux/last split, the checks on each file, the flags,
and the server lifecycle on a fake vLLM (a failed start quotes vLLM's error; SIGTERM stops the server).

The real engine against the transformers one is tests/extract/test_vllm_extract.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

from eagle3.errors import InputError
from eagle3.extract.config import ExtractConfig
from eagle3.extract.vllm_states import StatesFileError, TargetTail, read_states, split_states
from eagle3.serving.hidden_states import (FORMAT, kv_transfer_config, speculative_config, vllm_layer_ids)

from extract_testdata import cli_env, make_samples, write_merged, REPO

H = 8


def test_vllm_ids_are_ours_plus_one_and_the_last_layer_sorted():
    # our aux layer i = output of layer i = the input of layer i+1 = vLLM's id i+1; id L = last layer's output
    assert vllm_layer_ids([1, 14, 26], 30) == [2, 15, 27, 30]
    assert vllm_layer_ids([26, 1, 14], 30) == [2, 15, 27, 30]  # vLLM records in layer order, whatever the list
    assert speculative_config([2, 15, 27, 30]) == {
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27, 30]}}}
    kv = kv_transfer_config("/tmp/states")
    assert kv["kv_connector_module_path"] == "eagle3.serving.hidden_states_connector"
    assert kv["kv_role"] == "kv_producer" and kv["kv_connector_extra_config"] == {"shared_storage_path": "/tmp/states"}


def _rms_norm(weight: torch.Tensor):
    def norm(x):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    return norm


def test_split_takes_ids_plus_one_in_the_stores_order_and_norms_the_last_once():
    t, ids = 5, [2, 15, 27, 30]
    states = torch.stack([torch.full((t, H), float(k)) + torch.arange(H) for k in ids], dim=1)  # [T, 4, H]
    w = torch.linspace(0.5, 2.0, H)
    aux, last = split_states(states, ids, [14, 1, 26], 30, _rms_norm(w))  # the store's order, not sorted
    assert aux.shape == (t, 3 * H) and last.shape == (t, H) and last.dtype == torch.float32
    assert torch.equal(aux[:, :H], states[:, 1]) and torch.equal(aux[:, H:2 * H], states[:, 0])  # 14 -> id 15
    assert torch.equal(aux[:, 2 * H:], states[:, 2])
    assert torch.allclose(last, _rms_norm(w)(states[:, 3].float()))  # once: norm(norm(x)) would differ
    assert not torch.allclose(last, _rms_norm(w)(last))
    with pytest.raises(ValueError, match=r"\[16\]"):
        split_states(states, ids, [15, 1, 26], 30, _rms_norm(w))


def _states_file(path, tokens, ids=(2, 15, 27, 30), dtype=torch.bfloat16, fmt=FORMAT, states=None):
    t = len(tokens)
    states = torch.randn(t, len(ids), H).to(dtype) if states is None else states
    save_file({"hidden_states": states, "token_ids": torch.tensor(tokens, dtype=torch.long)}, str(path),
              metadata={"format": fmt, "layer_ids": json.dumps(list(ids))})
    return states


def test_read_states_returns_a_good_file(tmp_path):
    path = tmp_path / "req.safetensors"
    want = _states_file(path, [5, 6, 7])
    (tmp_path / "req.safetensors.lock").write_text("")  # released: the reader takes LOCK_SH and goes on
    got = read_states(str(path), "s1", [5, 6, 7], [2, 15, 27, 30], H, torch.bfloat16)
    assert torch.equal(got, want)


@pytest.mark.parametrize("make, read, message", [
    (dict(tokens=[5, 6]), {}, r"shape \[2, 4, 8\], not \[3, 4, 8\]"),
    (dict(tokens=[5, 6, 8]), {}, r"other tokens than the sample's 3 \(first differing at 2\)"),
    (dict(tokens=[5, 6, 7], dtype=torch.float32), {}, "torch.float32 states, not torch.bfloat16"),
    (dict(tokens=[5, 6, 7], ids=(1, 14, 26, 30)), {}, r"layer ids \[1, 14, 26, 30\], not the \[2, 15, 27, 30\]"),
    (dict(tokens=[5, 6, 7], fmt="other/1"), {}, "format 'other/1'"),
    (dict(tokens=[5, 6, 7], states=torch.full((3, 4, H), float("nan")).bfloat16()), {}, "non-finite"),
    (dict(tokens=[5, 6, 7]), dict(hidden_size=16), r"not \[3, 4, 16\]"),
])
def test_read_states_names_the_sample_and_file_and_what_is_wrong(tmp_path, make, read, message):
    path = tmp_path / "req.safetensors"
    _states_file(path, **make)
    args = {"hidden_size": H, **read}
    with pytest.raises(StatesFileError, match=message) as err:
        read_states(str(path), "sample-7", [5, 6, 7], [2, 15, 27, 30], args["hidden_size"], torch.bfloat16)
    assert "sample sample-7" in str(err.value) and str(path) in str(err.value)


def test_read_states_of_a_missing_or_truncated_file(tmp_path):
    with pytest.raises(StatesFileError, match="sample a: .* does not exist"):
        read_states(str(tmp_path / "none.safetensors"), "a", [1], [2], H, torch.bfloat16)
    path = tmp_path / "cut.safetensors"
    _states_file(path, [5, 6, 7])
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(StatesFileError, match="sample b: .*cut.safetensors from vLLM is unreadable"):
        read_states(str(path), "b", [5, 6, 7], [2, 15, 27, 30], H, torch.bfloat16)


def test_target_tail_is_the_targets_own_norm_with_its_weights(tiny_llama_dir, tmp_path):
    from eagle3.target import load_model

    model = load_model(tiny_llama_dir, "cpu", "float32")
    with torch.no_grad():
        model.model.norm.weight.copy_(torch.linspace(0.3, 1.7, model.config.hidden_size))
    model.save_pretrained(tmp_path / "t")  # non-trivial norm weights, read back from the checkpoint
    tail = TargetTail(str(tmp_path / "t"), "tiny")
    x = torch.randn(4, model.config.hidden_size)
    with torch.no_grad():
        assert torch.allclose(tail.final_norm(x), model.model.norm(x), atol=1e-6)
        assert torch.allclose(tail.lm_head(x), model.lm_head(x), atol=1e-5)


def _unknown_arch(tiny_llama_dir, folder, **extra) -> str:
    """The tiny Llama under a model_type this transformers does not know (a newer or custom-code target)."""
    import shutil

    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="eagle3_test_arch", architectures=["Eagle3TestArchForCausalLM"], **extra)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("custom_code", [False, True])
def test_target_tail_of_an_architecture_transformers_does_not_know_is_an_input_error(tiny_llama_dir, tmp_path,
                                                                                     custom_code):
    extra = {"auto_map": {"AutoConfig": "configuration_x.XConfig",
                          "AutoModelForCausalLM": "modeling_x.XForCausalLM"}} if custom_code else {}
    model = _unknown_arch(tiny_llama_dir, tmp_path / "t", **extra)
    with pytest.raises(InputError, match=f"^{tmp_path}/t/config.json: model 'x': transformers .* cannot build "
                                         "model_type 'eagle3_test_arch' .*--engine sglang --storage-option fp8-topk"):
        TargetTail(model, "x")  # custom code: refused, never run, never asked about on a terminal


def test_config_refuses_server_settings_for_the_transformers_engine():
    ExtractConfig("m", "x", "o", engine="vllm", tensor_parallel_size=8, quantization="fp8")
    with pytest.raises(InputError, match="tensor_parallel_size=8 only apply to engine='vllm'"):
        ExtractConfig("m", "x", "o", tensor_parallel_size=8)
    with pytest.raises(InputError, match="engine='tgi': choose one of transformers, vllm, sglang"):
        ExtractConfig("m", "x", "o", engine="tgi")
    assert ExtractConfig("m", "x", "o", engine="vllm", tensor_parallel_size=4, pipeline_parallel_size=2).gpus() == 8
    for args in (("--quantization", "fp8"), ("--quantization=fp8",), ("-q", "fp8")):  # the store records the field
        with pytest.raises(InputError, match="sets the server's quantization; set ExtractConfig.quantization"):
            ExtractConfig("m", "x", "o", engine="vllm", server_args=args)


# -- the lifecycle on a fake vLLM: a shell script standing in for vLLM's python ----------------------------
FAKE = """#!/bin/sh
[ "$1" = "-c" ] && exit 0   # the version probe
echo "$$" > "{pids}"
{body}
"""


def _fake_vllm(tmp_path, body: str) -> tuple[str, str]:
    pids = tmp_path / "server.pid"
    script = tmp_path / "python"
    script.write_text(FAKE.format(pids=pids, body=body))
    script.chmod(0o755)
    return str(script), str(pids)


def _extract_args(tmp_path, smollm2_dir) -> list[str]:
    merged = write_merged(tmp_path / "m", make_samples(3, seed=2, max_len=12))
    return ["--merged", merged, "--model", smollm2_dir, "--out", str(tmp_path / "s"), "--device", "cpu",
            "--engine", "vllm", "--precision", "float32"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_failed_start_quotes_vllms_own_error(tmp_path, smollm2_dir):
    python, pids = _fake_vllm(tmp_path, 'echo "ValueError: extract_hidden_states needs aux layer support" >&2\n'
                                        "exit 1")
    out = subprocess.run([sys.executable, "-m", "eagle3.cli", "extract", *_extract_args(tmp_path, smollm2_dir)],
                         cwd=REPO, env=cli_env(EAGLE3_VLLM_PYTHON=python), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0
    assert "vLLM said: ValueError: extract_hidden_states needs aux layer support" in out.stderr, out.stderr[-2000:]
    assert "draft" not in out.stderr.split("vLLM said:")[1].splitlines()[0]  # no draft to blame here
    assert _gone(int(open(pids).read()))


def test_an_architecture_transformers_does_not_know_exits_2_naming_config_json(tmp_path, tiny_llama_dir):
    """An input error (exit 2: Airflow does not retry it), not transformers' ValueError, before any server."""
    python, pids = _fake_vllm(tmp_path, "exec sleep 300")
    model = _unknown_arch(tiny_llama_dir, tmp_path / "t")
    merged = write_merged(tmp_path / "m", make_samples(3, seed=2, max_len=12))
    out = subprocess.run([sys.executable, "-m", "eagle3.cli", "extract", "--merged", merged, "--model", model,
                          "--out", str(tmp_path / "s"), "--device", "cpu", "--engine", "vllm"],
                         cwd=REPO, env=cli_env(EAGLE3_VLLM_PYTHON=python), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{model}/config.json: model {model!r}: transformers" in out.stderr, out.stderr[-2000:]
    assert "cannot build model_type 'eagle3_test_arch'" in out.stderr and "Traceback" not in out.stderr
    assert not os.path.exists(pids)  # no server was started


def test_sigterm_stops_the_server(tmp_path, smollm2_dir):
    python, pids = _fake_vllm(tmp_path, "exec sleep 300")  # never healthy
    proc = subprocess.Popen([sys.executable, "-m", "eagle3.cli", "extract", *_extract_args(tmp_path, smollm2_dir)],
                            cwd=REPO, env=cli_env(EAGLE3_VLLM_PYTHON=python), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not os.path.exists(pids) or not open(pids).read().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0][-2000:]
        time.sleep(0.2)
    server = int(open(pids).read())
    proc.send_signal(signal.SIGTERM)  # what Airflow's on_kill sends the supervised stage
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, log[-2000:]
    assert _gone(server), log[-2000:]
    assert "vLLM server (pid" in log and "stopped" in log
