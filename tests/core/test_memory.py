"""eagle3/memory.py: the counted activation bytes equal what autograd saves; the training prediction is within
25% of a training step's measured peak RSS; the target's parameter count from config.json alone."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle3 import memory
from eagle3.devices import BF16_CPU_FLAGS, cpu_flags, resolve_precision
from eagle3.errors import InputError
from tests.draft.tiny import make_tiny_draft

ROOT = Path(__file__).resolve().parents[2]
PRECISIONS = ("float32", "bfloat16")


def saved_per_token(precision: str, t: int, steps: int, checkpointed: bool, **shape) -> float:
    """Bytes autograd saves for a TTT forward of ``steps`` steps over t tokens, per token; the parameters,
    buffers and the caller's inputs left out (each storage counted once)."""
    from eagle3.draft.ttt import ttt_forward

    draft = make_tiny_draft(**shape)
    cfg = draft.config
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, t), generator=g)
    aux = torch.randn(1, t, 3 * cfg.hidden_size, generator=g)
    logits = torch.randn(1, t, cfg.draft_vocab_size, generator=g)
    skip = {x.untyped_storage().data_ptr() for x in [*draft.parameters(), *draft.buffers(), aux, logits]}
    seen: dict[int, int] = {}

    def pack(x):
        s = x.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return x

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            ttt_forward(draft, ids, aux, logits, torch.ones(1, t, dtype=torch.bool),
                        torch.ones(1, t, dtype=torch.long), ttt_length=steps, checkpoint_steps=checkpointed)
    return sum(seen.values()) / t


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize("shape", [
    dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
         vocab_size=400, draft_vocab_size=200),
    dict(hidden_size=96, intermediate_size=160, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
         vocab_size=500, draft_vocab_size=300),
])
def test_step_bytes_are_what_autograd_saves(precision, checkpointed, shape):
    t = 256
    s = memory.DraftShape(shape["hidden_size"], shape["intermediate_size"], shape["num_attention_heads"],
                          shape["num_key_value_heads"], shape["head_dim"], shape["vocab_size"],
                          shape["draft_vocab_size"])
    one, two = (saved_per_token(precision, t, n, checkpointed, **shape) for n in (1, 2))
    static = 0 if checkpointed else memory.step_static_bytes(s) / t  # per step, whatever t: spread over t here
    later = memory.step_bytes(s, precision, checkpointed, first=False) + static
    assert two - one == pytest.approx(later, rel=0.03, abs=16)
    if not (precision == "bfloat16" and not checkpointed):  # autocast's bf16 weight copies land in step 0
        first = memory.step_bytes(s, precision, checkpointed, first=True) + static
        assert one == pytest.approx(first, rel=0.03, abs=16)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_per_step_bytes_do_not_grow_with_the_length(precision):
    """The fused loss's lm_head gradient is per step: doubling t doubles only the per-token part."""
    shape = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=400, draft_vocab_size=200)
    s = memory.DraftShape(64, 96, 4, 2, 16, 400, 200)
    step = {t: (saved_per_token(precision, t, 2, False, **shape) - saved_per_token(precision, t, 1, False, **shape))
            * t for t in (128, 384)}
    per_token = memory.step_bytes(s, precision, False, first=False)
    assert (step[384] - step[128]) / 256 == pytest.approx(per_token, rel=0.03)
    assert step[128] - 128 * per_token == pytest.approx(memory.step_static_bytes(s), rel=0.03)


def test_prediction_within_25_percent_of_measured_peak_rss():
    """bench/train_bench.py --seq-lens runs one optimizer step of SmolLM2's draft shape per length in its own
    process (peak RSS from os.wait4), as the training loop runs a micro-batch."""
    precision = resolve_precision("auto", "cpu").name
    if precision == "bfloat16" and not set(BF16_CPU_FLAGS) & cpu_flags():
        pytest.skip("bf16 on a CPU without a bf16 matrix engine runs at ~1 GFLOP/s: a 4K step would take an "
                    "hour (docs/train.md \"Long context\" has bf16 peaks measured on an AMX machine)")
    lengths = (1024, 2048, 4096)
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train_bench.py"), "--seq-lens", ",".join(map(str, lengths)),
         "--precisions", precision, "--attention", "blockwise", "--iters", "1", "--no-warmup"],
        capture_output=True, text=True, timeout=1800, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["seq_len"] for r in rows] == list(lengths)
    shape = memory.DraftShape(576, 1536, 9, 3, 64, 49152, 8192)  # the bench's draft
    for r in rows:
        predicted = memory.training_peak(shape, r["seq_len"], 7, precision, device="cpu")["bytes"] / memory.GiB
        assert predicted == pytest.approx(r["peak_rss_gib"], rel=0.25), (r, predicted)


def test_largest_budget_fits_and_the_next_does_not():
    s = memory.DraftShape(7168, 18432, 64, 8, 128, 163840, 32000)
    n = memory.largest_budget(s, 80 * memory.GiB, 7, "bfloat16", False)
    fits = lambda k: memory.training_peak(s, k, 7, "bfloat16")["bytes"] <= memory.USABLE_SHARE * 80 * memory.GiB
    assert n > 0 and n % memory.BUDGET_STEP == 0 and fits(n) and not fits(n + memory.BUDGET_STEP)
    assert memory.largest_budget(s, 80 * memory.GiB, 7, "bfloat16", True) > 2 * n  # checkpointing pays here


@pytest.mark.slow
def test_target_params_of_smollm2_equal_its_weights():
    from safetensors import safe_open

    from eagle3.target import read_config, resolve_model

    model = Path(resolve_model("smollm2-135m-instruct"))
    total = 0
    for f in model.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                total += math.prod(h.get_slice(k).get_shape())
    assert memory.target_params(read_config(str(model)))["total"] == total


def kimi_k2_config() -> dict:
    """Kimi-K2-Thinking's config.json (DeepSeek-V3 architecture, INT4 experts), as published: 1.03T parameters;
    compressed-tensors, 4-bit groups of 32 with a bf16 scale each, attention, shared experts and the dense MLP
    kept at bf16 (its ``ignore``). Its checkpoint is ~594 GB."""
    return {"model_type": "kimi_k2", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384,
            "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "vocab_size": 163840, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {
                "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                              "output_activations": None,
                                              "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                          "strategy": "group", "group_size": 32, "dynamic": False,
                                                          "actorder": None, "block_structure": None,
                                                          "observer": "minmax", "observer_kwargs": {}}}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
                "kv_cache_scheme": None}}


def gpt_oss_120b_config() -> dict:
    """gpt-oss-120b's config.json as published (its size keys): MXFP4 experts, attention and router at bf16."""
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
            "intermediate_size": 2880, "head_dim": 64, "num_hidden_layers": 36, "num_attention_heads": 64,
            "num_key_value_heads": 8, "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
            "vocab_size": 201088, "tie_word_embeddings": False, "max_position_embeddings": 131072,
            "quantization_config": {"quant_method": "mxfp4",
                                    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                               "model.embed_tokens", "lm_head"]}}


H200 = 143771 * 2 ** 20  # nvidia-smi's memory.total of an H200 (140.4 GiB)


def test_target_params_of_a_1t_moe_from_config_alone():
    n = memory.target_params(kimi_k2_config())["total"]
    assert 1.00e12 < n < 1.06e12
    w = memory.target_weight_bytes(kimi_k2_config())
    # 4 bits + a bf16 scale per 32 = 4.5 bits for the routed experts; the rest at bf16: the published ~594 GB
    assert w["dtype"] == "4.5-bit quantized" and w["source"] == "config.json"
    assert w["bytes"] == pytest.approx(594e9, rel=0.01)


def test_a_k2_thinking_checkpoint_needs_8_h200s():
    """Counted at 4 bits without its scales and with everything quantized, K2-Thinking was 517 GB and 4 H200s
    passed the gate, where vLLM needs ~138 GiB of weights per rank."""
    config = kimi_k2_config()
    assert memory.target_weight_bytes(config)["bytes"] >= 550e9
    assert memory.min_tensor_parallel(config, H200, 8192, 8192) == 8


def test_mxfp4_is_4_25_bits_and_gpt_oss_120b_fits_one_80_gib_gpu():
    """gpt-oss-120b's checkpoint is ~65 GB; counted at 16 bits (mxfp4 unknown) it needed 4 GPUs."""
    w = memory.target_weight_bytes(gpt_oss_120b_config())
    assert w["dtype"] == "4.25-bit quantized" and 60e9 < w["bytes"] < 80e9
    assert memory.min_tensor_parallel(gpt_oss_120b_config(), 80 * memory.GiB, 8192, 8192) == 1


@pytest.mark.parametrize("quantization, bits", [
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}}}, 4.5),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, 4.5),
    ({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32}}}}, 4.25),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 4.125),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, 4),  # per channel: scales negligible
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 8),
])
def test_bits_per_quantized_weight_include_the_scales(quantization, bits):
    config = {**LLAMA_8B, "quantization_config": quantization}
    assert memory.target_weight_bytes(config)["dtype"] == f"{bits:g}-bit quantized"


def test_an_unknown_quant_method_is_refused_naming_it():
    config = {**LLAMA_8B, "quantization_config": {"quant_method": "hqq", "nbits": 4}}
    with pytest.raises(InputError, match=r"config.json: .*quant_method 'hqq' is not one the memory model counts"):
        memory.target_weight_bytes(config)


def test_the_index_total_size_is_the_weights_exactly(tmp_path, s3_bucket):
    """model.safetensors.index.json's metadata.total_size (what the checkpoint holds, scales and all) wins over the
    count, local or on s3 (one small file, no weights); the transformers engine's precision still rescales it."""
    from eagle3 import storage

    total = 123_456_789_012
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(kimi_k2_config()))
    assert memory.checkpoint_bytes(str(folder)) is None  # no index: counted from config.json
    index = json.dumps({"metadata": {"total_size": total}, "weight_map": {}})
    (folder / memory.INDEX_FILE).write_text(index)
    storage.write_text(f"{s3_bucket}/target/{memory.INDEX_FILE}", index)
    assert memory.checkpoint_bytes(str(folder)) == memory.checkpoint_bytes(f"{s3_bucket}/target") == total
    w = memory.target_weight_bytes(kimi_k2_config(), stored=total)
    assert w["bytes"] == total and w["source"] == memory.INDEX_FILE
    assert memory.extraction_peak(kimi_k2_config(), 1024, "vllm", 8, stored=total)["parts"]["weights"] == total // 8
    dense = memory.target_weight_bytes(LLAMA_8B, "float32", stored=16_060_522_496)  # bf16 as stored
    assert dense["bytes"] == 2 * 16_060_522_496
    unknown = {**LLAMA_8B, "quantization_config": {"quant_method": "hqq"}}
    assert memory.target_weight_bytes(unknown, stored=total)["bytes"] == total  # the index needs no quantizer


LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
            "tie_word_embeddings": False}


def test_the_smallest_gpu_is_measured_and_a_mig_one_refused(tmp_path, monkeypatch):
    """nvidia-smi's memory.total is the whole GPU's even when MIG splits it: a slice's memory must be given."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '143771, [N/A]'\necho '81559, Disabled'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert memory.device_memory() == (81559 * 2 ** 20, "cuda")
    smi.write_text("#!/bin/sh\necho '81559, Enabled'\n")
    with pytest.raises(InputError, match=f"MIG is enabled.*device_memory_gib \\(or {memory.GPU_MEMORY_ENV}\\)"):
        memory.device_memory()
    assert memory.device_memory(80) == (80 * memory.GiB, "given")
