"""The gate's memory check (eagle3/verify/sizing.py over eagle3/memory.py) and its per-engine extraction hours,
on targets described by their config.json alone (no weights)."""

from __future__ import annotations

import json

import pytest

from eagle3 import memory, rates
from eagle3.verify import VerifyConfig, verify
from tests.verify.test_verify import failed_checks, merged  # noqa: F401  (the fixture)

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
SMOL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "torch_dtype": "bfloat16",
        "tie_word_embeddings": True}


def target(tmp_path, config: dict, name: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_transformers_refused_for_a_target_one_device_cannot_hold(tmp_path, merged):  # noqa: F811
    model = target(tmp_path, LLAMA_70B, "llama70b")
    failed, msg, checks = failed_checks(merged, model=model, target_engine="transformers", device_memory_gib=80)
    assert failed == {"memory"}
    assert "target_engine=transformers" in msg and "use target_engine=vllm with tensor parallelism" in msg
    assert "target_tensor_parallel_size=2" in msg  # 141 GB of bf16 weights: two 80 GiB devices
    assert checks["memory"]["extraction"]["weights"]["params"] == pytest.approx(70.6e9, rel=0.01)
    # The same target through vLLM over 4 devices passes, and training is sized for the 8192-wide draft.
    result = verify(VerifyConfig(merged, model=model, target_engine="vllm", tensor_parallel_size=4,
                                 device_memory_gib=80))
    mem = {c["name"]: c for c in result["checks"]}["memory"]
    # 7,104 tokens fit one 80 GiB device (with the CUDA allocator's measured excess): under the 8192 default cap
    assert mem["passed"] and result["train_token_budget"] == mem["fits_token_budget"] == 7104
    on_h200 = verify(VerifyConfig(merged, model=model, target_engine="vllm", tensor_parallel_size=4,
                                  device_memory_gib=141))
    assert on_h200["train_token_budget"] == 8192  # the default cap, under what fits there


def test_vllm_with_too_few_ranks_names_the_tensor_parallel_size(tmp_path, merged):  # noqa: F811
    model = target(tmp_path, LLAMA_70B, "llama70b")
    failed, msg, _ = failed_checks(merged, model=model, target_engine="vllm", tensor_parallel_size=1,
                                   device_memory_gib=80)
    assert failed == {"memory"} and "target_tensor_parallel_size=2 splits it" in msg


def test_sglang_is_sized_as_a_server_too(tmp_path, merged):  # noqa: F811
    """A target one device cannot hold may use sglang as well as vllm (split over its tensor parallel ranks);
    too few ranks names sglang and the size that fits; its extraction hours use its own measured rate."""
    model = target(tmp_path, LLAMA_70B, "llama70b")
    failed, msg, _ = failed_checks(merged, model=model, target_engine="transformers", device_memory_gib=80)
    assert "or target_engine=sglang the same way (storage_option fp8-topk only" in msg
    ok = verify(VerifyConfig(merged, model=model, target_engine="sglang", storage_option="fp8-topk",
                             tensor_parallel_size=4, device_memory_gib=80))
    vllm = verify(VerifyConfig(merged, model=model, target_engine="vllm", storage_option="fp8-topk",
                               tensor_parallel_size=4, device_memory_gib=80))
    mem = {c["name"]: c for c in ok["checks"]}["memory"]
    assert mem["passed"] and mem["extraction"] == {c["name"]: c for c in vllm["checks"]}["memory"]["extraction"]
    failed, msg, _ = failed_checks(merged, model=model, target_engine="sglang", storage_option="fp8-topk",
                                   tensor_parallel_size=1, device_memory_gib=80)
    assert failed == {"memory"} and "target_engine=sglang with target_tensor_parallel_size=1" in msg
    assert "target_tensor_parallel_size=4 splits it" in msg  # fp8-topk's [N, V] logits need 4 here
    store = str(tmp_path / "store")
    rates.record(store, "sglang", model, "0of1", tokens=9000, seconds=10.0)
    space = {c["name"]: c for c in verify(VerifyConfig(merged, model=model, store=store, target_engine="sglang",
                                                       storage_option="fp8-topk", tensor_parallel_size=4,
                                                       device_memory_gib=80))["checks"]}["extraction_space"]
    assert space["engine"] == "sglang" and space["tokens_per_s"] == 900.0


def test_the_gate_picks_the_largest_budget_that_fits(tmp_path, merged):  # noqa: F811
    model = target(tmp_path, SMOL, "smol")
    shape = memory.DraftShape.from_target(SMOL, 8192)
    result = verify(VerifyConfig(merged, model=model, device_memory_gib=3, precision="float32",
                                 train_token_budget=65536))
    fits = memory.largest_budget(shape, 3 * memory.GiB, 7, "float32", False, device="cuda")
    assert 0 < result["train_token_budget"] == fits < 65536
    peak = memory.training_peak(shape, fits, 7, "float32")["bytes"]
    assert peak <= memory.USABLE_SHARE * 3 * memory.GiB
    capped = verify(VerifyConfig(merged, model=model, device_memory_gib=3, precision="float32",
                                 train_token_budget=256))
    assert capped["train_token_budget"] == 256


def test_one_sample_that_cannot_fit_fails_naming_the_settings(tmp_path, merged):  # noqa: F811
    model = target(tmp_path, SMOL, "smol")
    shape = memory.DraftShape.from_target(SMOL, 8192)
    static = memory.training_peak(shape, 0, 7, "float32")["static"]
    gib = (static + 30 * memory.training_peak(shape, 0, 7, "float32")["per_token"]) / memory.USABLE_SHARE / memory.GiB
    failed, msg, _ = failed_checks(merged, model=model, device_memory_gib=gib, precision="float32")
    assert failed == {"memory"} and "training: one sample of" in msg
    assert "set checkpoint_ttt_steps" in msg or "lower max_seq_len" in msg


def test_extraction_hours_per_engine_from_the_runs_before(tmp_path, merged):  # noqa: F811
    model = target(tmp_path, SMOL, "smol")
    store = str(tmp_path / "store")
    rates.record(store, "transformers", model, "0of2", tokens=1000, seconds=10.0)  # 100 tok/s per task
    rates.record(store, "transformers", model, "1of2", tokens=1000, seconds=10.0)
    rates.record(store, "vllm", model, "0of1", tokens=4000, seconds=10.0)  # 400 tok/s
    rates.record(store, "vllm", "another-model", "0of1", tokens=1, seconds=100.0)  # not this target's
    for engine, rate in (("transformers", 200.0), ("vllm", 400.0)):
        result = verify(VerifyConfig(merged, model=model, store=store, target_engine=engine))
        space = {c["name"]: c for c in result["checks"]}["extraction_space"]
        assert space["tokens_per_s"] == rate and space["engine"] == engine
        assert space["hours"] == pytest.approx(result["tokens"] / rate / 3600)
        assert set(space["engines"]) == {"transformers", "vllm"} and "measured" in space["detail"]
        assert result["training_mode"]["costs"]["extract_tokens_per_s"] == rate
    # No measurement for this target: the tokens_per_s parameter.
    other = verify(VerifyConfig(merged, model=target(tmp_path, SMOL, "fresh"), store=store, tokens_per_s=123.0))
    assert {c["name"]: c for c in other["checks"]}["extraction_space"]["tokens_per_s"] == 123.0


def test_online_from_vllm_leaves_the_trainers_device_to_the_draft(tmp_path, merged):  # noqa: F811
    model = target(tmp_path, LLAMA_70B, "llama70b")
    # online with the target inside the trainer: the 70B forward would share the trainer's device
    failed, msg, _ = failed_checks(merged, model=model, training_mode="online", target_engine="transformers",
                                   device_memory_gib=80)
    assert failed == {"memory"} and "training_mode=online runs it inside training" in msg
    # online from a vLLM server on its own devices: nothing of the target is reserved on the trainer's
    result = verify(VerifyConfig(merged, model=model, training_mode="online", target_engine="vllm",
                                 tensor_parallel_size=4, device_memory_gib=80))
    mem = {c["name"]: c for c in result["checks"]}["memory"]
    offline = verify(VerifyConfig(merged, model=model, training_mode="offline", target_engine="vllm",
                                  tensor_parallel_size=4, device_memory_gib=80))
    assert mem["passed"] and mem["fits_token_budget"] == \
        {c["name"]: c for c in offline["checks"]}["memory"]["fits_token_budget"]


def test_sequence_parallel_sizes_a_share_of_each_sample_per_device(tmp_path, merged):  # noqa: F811
    """A sample too long for one device fails with sequence_parallel named; over 4 sequence-parallel processes
    each device holds a quarter of it, and the gate's budget is 4x one device's."""
    model = target(tmp_path, SMOL, "smol")
    shape = memory.DraftShape.from_target(SMOL, 8192)
    per = memory.training_peak(shape, 0, 7, "float32", checkpoint_steps=True)
    gib = (per["static"] + 30 * per["per_token"]) / memory.USABLE_SHARE / memory.GiB
    failed, msg, _ = failed_checks(merged, model=model, device_memory_gib=gib, precision="float32",
                                   checkpoint_ttt_steps=True)
    assert failed == {"memory"} and "or set sequence_parallel" in msg
    one = verify(VerifyConfig(merged, model=model, device_memory_gib=3, precision="float32",
                              train_token_budget=1 << 20))
    four = verify(VerifyConfig(merged, model=model, device_memory_gib=3, precision="float32",
                               train_token_budget=1 << 20, sequence_parallel=True, train_processes=4))
    # a quarter of the per-token terms per device, plus every position's gathered keys: a little under 4x
    assert 3.5 * one["train_token_budget"] < four["train_token_budget"] < 4 * one["train_token_budget"]
    shape4 = memory.largest_budget(memory.DraftShape.from_target(SMOL, 8192), 3 * memory.GiB, 7, "float32", False,
                                   device="cuda", seq_parallel=4)
    assert four["train_token_budget"] == shape4
    mem = {c["name"]: c for c in four["checks"]}["memory"]
    assert f"{-(-shape4 // 4)} per device over 4 sequence-parallel processes" in mem["detail"]
