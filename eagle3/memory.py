"""The memory model: peak bytes of extraction and of a training micro-batch per device, before either runs.

Torch-free; the verify gate uses it (eagle3/verify/sizing.py) to pick the training token budget and to refuse
settings that cannot fit. Every term is counted from what the code allocates, not fitted to a peak:

Training (eagle3/train/loop.py, one micro-batch of N padded tokens, rows x longest row):
  static     draft params P: fp32 weights + grads + AdamW's two moments = 16 P (bf16 autocast adds a
             2 P cache of bf16 weight copies); the frozen embedding and, for stores that keep `last`,
             the target's lm_head, both fp32 [V, H] (eagle3/draft/build.py loads them so); the runtime;
             per TTT step, the fused loss's fp32 lm_head gradient [Vd, H] (eagle3/draft/loss.py computes it in
             the forward and saves it; with checkpointed steps only the step being recomputed holds one).
             The loss's blocks of logits, their gradient and fp32 copy are bounded whatever T
             (`loss_workspace_bytes`: 49 MiB on a CPU, 640 MiB on a GPU, whose blocks are larger).
  per token  inputs as collated (eagle3/train/data.py: ids int64, aux fp32 [3H], last fp32 [H]);
             the target's draft-vocab logits fp32 [Vd]; the TTT steps' saved activations (`step_bytes`).
             The fused loss keeps no [T, Vd] tensor: its saved h gradient (fp32 [H]) is in `step_bytes`.
The per-step activation coefficients were counted with `torch.autograd.graph.saved_tensors_hooks` over
the draft's TTT step on shapes varied one dimension and the length at a time (tests/core/test_memory.py re-counts
them), so the blockwise attention's O(T) cost is in them: it saves q, k, v, the output and one log-sum-exp per row.

What the allocator keeps is not counted: on the CPU, the freed blocks glibc keeps in the threads' arenas (with its
default dynamic mmap threshold, identical 4K fp32 training steps measured 0-0.7 GiB of peak RSS over the prediction;
bench/train_bench.py ALLOCATOR_ENV measures without it; the trainer fixes the threshold at 32 MiB and keeps up to
256 MiB at a heap's top: `CPU_MALLOC`). On CUDA the caching allocator's reserve and an uncounted transient of the
forward pass are a measured share of the rest (`CUDA_TRAIN_EXCESS`). USABLE_SHARE and the OOM retry are the margin.

Extraction: the target's weights (the checkpoint's model.safetensors.index.json total_size where it has one, else
counted by dtype or quantization, scales and the modules it keeps at 16 bits included; split over tensor x
pipeline parallel ranks) plus the forward's activations for the token budget (hidden streams, the MLP's inner
width, the captured aux/last and, for the top-k storage, the [N, V] logits); a served engine (vllm, sglang) also
reserves one max_seq_len sample's KV cache.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

GiB = 2 ** 30

RUNTIME_BYTES = {"cpu": 300 * 2 ** 20, "cuda": GiB}
"""What a training process holds before its tensors: on CPU Python + torch + oneDNN (a process that built
SmolLM2's draft measured 554 MiB RSS, of which 265 MiB are its tensors); on CUDA the context and kernels
(about 0.5-1 GiB on recent GPUs, which torch's allocator does not count but the device does)."""
CUDA_TRAIN_EXCESS = 0.16
"""On CUDA, the caching allocator's reserved peak of a training step over the counted tensors: 1.13-1.16x on an
H200 (2026-12-04; bench/train_bench.py --device cuda, bf16, Llama-3-8B widths at 1x4096 and 4x2048, Kimi-K2's
at 4K and 16K: allocated 1.07-1.10x, the rest the allocator's rounding and cached blocks). The allocated excess
is a transient at the end of the forward pass (`--phases`: 3.7 GiB at Llama-3-8B widths, 7.6 GiB at Kimi-K2's,
above what the backward starts with), not yet attributed; so it is a measured share, not a counted term."""
USABLE_SHARE = 0.9
"""Share of the device's memory the gate lets a prediction use: the allocator's fragmentation and what the
model leaves out (the OOM retry is the safety net)."""
BUDGET_STEP = 64
"""Token budgets the gate picks are multiples of this (the DAG's Param minimum)."""

LOSS_BLOCK_BYTES = 16 << 20
"""The fused loss's logits per block on a CPU (eagle3/draft/loss.py; 1,024 rows in bf16 at Vd 8192): big enough for
efficient GEMMs, under glibc's mmap threshold ceiling (32 MiB), so the blocks' buffers are reused instead of mapped
and faulted anew."""
LOSS_CHUNK_BYTES = 1 << 20
"""fp32 logits per elementwise chunk on a CPU (32 rows at Vd 8192): a chunk's two passes stay in L2."""
CUDA_LOSS_BLOCK_BYTES = 128 << 20
"""Logits per block on a GPU (2,048 rows in bf16 at Vd 32,000), one elementwise chunk per block: the CPU's sizes
launch ~10 kernels per 8 rows there, and an H200 step at Llama-3-8B widths ran launch-bound (bench/train_bench.py
--loss-blocks measures both side by side)."""


def block_sizes(device_type: str) -> tuple[int, int]:
    """The fused loss's (logit bytes per block, fp32 logit bytes per elementwise chunk) on that kind of device."""
    if device_type == "cuda":
        return CUDA_LOSS_BLOCK_BYTES, 2 * CUDA_LOSS_BLOCK_BYTES  # the chunk holds a whole block's fp32 copy
    return LOSS_BLOCK_BYTES, LOSS_CHUNK_BYTES


def loss_workspace_bytes(device_type: str) -> int:
    """The most one block of the fused loss holds: its logits, their gradient, a gathered block of probabilities
    and an fp32 chunk."""
    block, chunk = block_sizes(device_type)
    return 3 * block + chunk


BYTES_PER_DTYPE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8": 1, "fp8": 1,
                   "int8": 1, "int4": 0.5}


@dataclass(frozen=True)
class DraftShape:
    """The draft's widths, which are the target's (eagle3/draft/config.py DraftConfig)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    """V: the target's lm_head rows (the frozen embedding and the soft labels' head are [V, H])."""
    draft_vocab: int
    """Vd."""

    @classmethod
    def from_target(cls, config: dict, draft_vocab: int) -> "DraftShape":
        from eagle3.target import config_vocab_size

        h, nh = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(hidden=h, intermediate=int(config["intermediate_size"]), heads=nh,
                   kv_heads=int(config.get("num_key_value_heads") or nh),
                   head_dim=int(config.get("head_dim") or h // nh), vocab=config_vocab_size(config),
                   draft_vocab=int(draft_vocab))

    def params(self) -> int:
        """Trainable draft parameters: fc, q/k/v/o (2H inputs), the MLP, lm_head and 4 norms."""
        h, hq, hkv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (3 * h * h + 2 * h * (hq + 2 * hkv) + hq * h + 3 * h * self.intermediate
                + h * self.draft_vocab + 4 * h)


def step_bytes(s: DraftShape, precision: str, checkpointed: bool, first: bool) -> float:
    """Bytes per token that one TTT step leaves saved for backward (first: step 0, which adds fc). Coefficients
    per unit of each width, counted with saved_tensors_hooks; `step_static_bytes` is the per-step rest."""
    hq, hkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    bf16 = precision == "bfloat16"
    if checkpointed:  # only the step's inputs and outputs: hidden [H] and its k, v
        return (8 if bf16 and first else 4) * s.hidden + (0 if first else (4 if bf16 else 8) * hkv)
    if bf16:  # linear outputs in bf16; norms, rope tables, log-sum-exp and the loss's h gradient stay fp32
        per = 44 * s.hidden + 8 * s.intermediate + 4 * hq + 4 * hkv + 4 * s.heads
    else:
        per = 40 * s.hidden + 16 * s.intermediate + 8 * hq + 8 * hkv + 4 * s.heads
    per += 8 * s.head_dim + 12  # rope cos/sin of the step's positions; masks
    if first:
        per += (10 if bf16 else 4) * s.hidden  # fc's input and output
    return per


def step_static_bytes(s: DraftShape) -> int:
    """Bytes one un-checkpointed TTT step saves whatever the length: the fused loss's fp32 lm_head gradient."""
    return 4 * s.draft_vocab * s.hidden


def training_peak(s: DraftShape, tokens: int, ttt_length: int, precision: str = "float32",
                  checkpoint_steps: bool = False, soft_labels: bool = True, device: str = "cuda",
                  seq_parallel: int = 1) -> dict:
    """Predicted peak bytes of one training micro-batch of ``tokens`` padded tokens on one device.

    ``soft_labels``: the store keeps `last`, so the target's lm_head [V, H] is on the device (top-k stores
    carry log-probs instead). ``seq_parallel``: the micro-batch's positions are split over that many devices
    (eagle3/draft/sequence.py), so a device holds 1/seq_parallel of the per-token terms, plus every position's
    gathered step-0 keys and values. Returns {"bytes", "static", "per_token" (per token of the micro-batch),
    "parts"} (parts: name -> bytes)."""
    p = s.params()
    static = {"draft weights, grads, AdamW": 16 * p + (2 * p if precision == "bfloat16" else 0),
              "frozen embedding": 4 * s.vocab * s.hidden,
              "target lm_head": 4 * s.vocab * s.hidden if soft_labels else 0,
              "loss's lm_head gradients": step_static_bytes(s) * (1 if checkpoint_steps else ttt_length),
              "loss's logit blocks": loss_workspace_bytes("cuda" if device.startswith("cuda") else "cpu"),
              "runtime": RUNTIME_BYTES["cuda" if device.startswith("cuda") else "cpu"]}
    acts = step_bytes(s, precision, checkpoint_steps, True) + (ttt_length - 1) * step_bytes(
        s, precision, checkpoint_steps, False)
    if checkpoint_steps:  # backward runs one step again: its whole activations are alive then
        acts += step_bytes(s, precision, False, False)
    per_token = {"inputs": 16 * s.hidden + 17, "target logits": 4 * s.draft_vocab, "ttt activations": acts}
    if seq_parallel > 1:
        per_token = {k: v / seq_parallel for k, v in per_token.items()}
        # every position's k0/v0 (compute dtype), their fp32 gradients in the attention's backward, the
        # cast back and the all_reduce's copy: (8 + 6 b) bytes per kv element, b the compute dtype's size
        b = 2 if precision == "bfloat16" else 4
        per_token["gathered step-0 keys"] = (8 + 6 * b) * s.kv_heads * s.head_dim
    if device.startswith("cuda"):  # what the allocator reserves beyond the counted tensors, measured
        static["CUDA allocator's excess (static)"] = CUDA_TRAIN_EXCESS * (sum(static.values()) - static["runtime"])
        per_token["CUDA allocator's excess (per token)"] = CUDA_TRAIN_EXCESS * sum(per_token.values())
    parts = {**static, **{k: v * tokens for k, v in per_token.items()}}
    return {"bytes": int(sum(parts.values())), "static": int(sum(static.values())),
            "per_token": float(sum(per_token.values())), "parts": {k: int(v) for k, v in parts.items()}}


def largest_budget(s: DraftShape, memory: int, ttt_length: int, precision: str, checkpoint_steps: bool,
                   soft_labels: bool = True, device: str = "cuda", reserved: int = 0, seq_parallel: int = 1) -> int:
    """The largest token budget (a multiple of BUDGET_STEP; 0 if none) whose predicted peak plus ``reserved``
    (another tenant of the device: a colocated target) fits USABLE_SHARE of ``memory`` bytes (with
    ``seq_parallel``, of each of that many devices sharing the micro-batch's positions)."""
    peak = training_peak(s, 0, ttt_length, precision, checkpoint_steps, soft_labels, device, seq_parallel)
    room = USABLE_SHARE * memory - peak["static"] - reserved
    n = int(room / peak["per_token"]) if room > 0 else 0
    return n // BUDGET_STEP * BUDGET_STEP


# -- the target ---------------------------------------------------------------------------------------------

MICROSCALING_BITS = {"mxfp4": 4.25, "nvfp4": 4.5}
"""Bits per weight of the 4-bit microscaling formats, scales included: mxfp4 an 8-bit (E8M0) scale per 32 values,
nvfp4 an fp8 (E4M3) scale per 16 (and an fp32 one per tensor, negligible)."""
SCALE_BYTES = 2
"""An integer quantizer's scale (fp16/bf16), one per ``group_size`` weights; per-channel or per-block scales (no
group_size) are negligible."""
MODULE_NAMES = {
    "attention": ("model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.o_proj"),
    "dense_mlp": ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"),
    "shared_experts": ("model.layers.1.mlp.shared_experts.gate_proj", "model.layers.1.mlp.shared_expert.gate_proj"),
    "experts": ("model.layers.1.mlp.experts.0.gate_proj", "model.layers.1.mlp.experts.gate_up_proj",
                "model.layers.1.block_sparse_moe.experts.0.w1"),
}
"""The layers' quantizable modules by kind, named as Hugging Face checkpoints name them (Llama, DeepSeek/Kimi,
Qwen-MoE, gpt-oss, Mixtral; a dense model's MLP is `dense_mlp`): what a quantization_config's ignore /
modules_to_not_convert / exclude_modules patterns are matched against. A kind that a pattern matches in any of its
names stays at 16 bits whole (a pattern that keeps part of a kind counts all of it: the safe side). Norms, routers,
the embedding and lm_head are counted unquantized whatever the config says (lm_head is in every ignore list seen)."""
INDEX_FILE = "model.safetensors.index.json"


def _kept(pattern: str, name: str) -> bool:
    """Whether an ignore entry names the module ``name``: compressed-tensors' ``re:<regex>`` (re.match on the full
    name), else a name or glob (transformers' ``model.layers.*.self_attn``) of the module or a parent, or of
    their last components (``lm_head``, ``router``)."""
    import fnmatch
    import re

    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    parts = name.split(".")
    return any(fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p, "*." + pattern)
               for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)))


def _quantization(config: dict) -> dict | None:
    """config.json's quantization_config as {"method", "bits" (per quantized weight, scales included; None: a
    method the model does not know), "kept" (the kinds of MODULE_NAMES it leaves unquantized)}; None: not
    quantized."""
    q = config.get("quantization_config") or {}
    if not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]  # compressed-tensors
    weights = [g.get("weights") or {} for g in groups]
    tags = [str(t).lower() for t in (method, q.get("format"), q.get("quant_algo"), *(g.get("format") for g in groups))
            if t]
    bits = q.get("bits") or q.get("w_bit") or max((w.get("num_bits") or 0 for w in weights), default=0)
    sizes = [s for s in (q.get("group_size"), q.get("q_group_size"), *(w.get("group_size") for w in weights))
             if s and int(s) > 0]  # GPTQ's -1: per channel
    micro = [b for name, b in MICROSCALING_BITS.items() if any(name in t for t in tags)]
    if micro:
        per = max(micro)
    elif bits:
        per = int(bits) + (8 * SCALE_BYTES / min(int(s) for s in sizes) if sizes else 0)
    elif any("fp8" in t for t in tags):  # DeepSeek's block fp8, fbgemm, modelopt FP8: one scale per block
        per = 8
    else:
        per = None
    ignore = [str(p) for key in ("ignore", "modules_to_not_convert", "exclude_modules") for p in (q.get(key) or ())]
    kept = {kind for kind, names in MODULE_NAMES.items() if any(_kept(p, n) for p in ignore for n in names)}
    return {"method": method or "?", "bits": per, "kept": kept}


def checkpoint_bytes(model: str | None) -> int | None:
    """The target's weight bytes as its model.safetensors.index.json states them (``metadata.total_size``: exact,
    scales and unquantized modules included), read without the weights (one small file, on s3 too); None where
    the folder has none (a single-file checkpoint)."""
    if not model:
        return None
    from eagle3 import storage
    from eagle3.target import resolve_model

    uri = storage.join(model if storage.is_s3(model) else resolve_model(model), INDEX_FILE)
    if not storage.exists(uri):
        return None
    size = (storage.read_json(uri).get("metadata") or {}).get("total_size")
    return int(size) if size else None


def target_params(config: dict) -> dict:
    """Parameter counts from config.json alone: {"embedding", "layers", "lm_head", "total", "parts" (the layers'
    by kind: MODULE_NAMES' kinds, "router" and "norms")}. Dense Llama-style attention, or DeepSeek's MLA
    (q_lora_rank / kv_lora_rank); dense MLP, or MoE (n_routed_experts or num_experts, with shared experts and
    dense first layers)."""
    from eagle3.target import config_vocab_size

    h, layers, nh = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    v = config_vocab_size(config)
    hd = int(config.get("head_dim") or h // nh)
    nkv = int(config.get("num_key_value_heads") or nh)
    if config.get("kv_lora_rank"):  # MLA
        qk = int(config["qk_nope_head_dim"]) + int(config["qk_rope_head_dim"])
        qlr, kvlr, vd = int(config.get("q_lora_rank") or 0), int(config["kv_lora_rank"]), int(config["v_head_dim"])
        attn = (h * qlr + qlr * nh * qk if qlr else h * nh * qk) + h * (kvlr + int(config["qk_rope_head_dim"]))
        attn += kvlr * nh * (int(config["qk_nope_head_dim"]) + vd) + nh * vd * h
    else:
        attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    dense_mlp = 3 * h * int(config["intermediate_size"])
    experts = int(config.get("n_routed_experts") or config.get("num_experts") or config.get("num_local_experts") or 0)
    parts = {"attention": layers * attn, "dense_mlp": layers * dense_mlp, "shared_experts": 0, "experts": 0,
             "router": 0, "norms": layers * 2 * h}
    if experts:
        moe_i = int(config.get("moe_intermediate_size") or config["intermediate_size"])
        dense_layers = int(config.get("first_k_dense_replace") or 0)
        moe_layers = layers - dense_layers
        parts.update(dense_mlp=dense_layers * dense_mlp, experts=moe_layers * 3 * h * moe_i * experts,
                     shared_experts=moe_layers * 3 * h * moe_i * int(config.get("n_shared_experts") or 0),
                     router=moe_layers * h * experts)
    body = sum(parts.values())
    head = 0 if config.get("tie_word_embeddings") else v * h
    return {"embedding": v * h, "layers": body, "lm_head": head, "total": v * h + body + head + h, "parts": parts}


def target_weight_bytes(config: dict, precision: str | None = None, stored: int | None = None) -> dict:
    """Bytes of the target's weights: {"bytes", "params", "dtype", "source"}. ``stored``: the checkpoint's bytes
    (`checkpoint_bytes`), used as they are; else counted from config.json: the quantized kinds at the
    quantization's bits (scales included), everything else at ``precision`` (what the transformers engine loads
    them in; None: the checkpoint's torch_dtype). An unquantized part loaded in another precision than stored
    is rescaled either way. A quant_method the model does not know is an InputError rather than a guess."""
    n = target_params(config)
    stored_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    width = BYTES_PER_DTYPE.get(stored_dtype, 2)
    dense = BYTES_PER_DTYPE.get(precision or stored_dtype, 2)
    q = _quantization(config)
    if q is not None and q["bits"] is None and not (stored and dense == width):  # the index needs no quantizer
        from eagle3.errors import InputError

        raise InputError(f"quantization_config.quant_method {q['method']!r} is not one the memory model counts "
                         f"({', '.join(MICROSCALING_BITS)}, fp8, or a `bits`/`num_bits` with its group_size); put "
                         f"the checkpoint's {INDEX_FILE} (its metadata.total_size is used as is) beside it",
                         file="config.json")
    quantized = 0 if q is None or q["bits"] is None else sum(
        n["parts"][kind] for kind in MODULE_NAMES if kind not in q["kept"])
    if stored:  # rescaled by what is unquantized: all of it, or what the count leaves at 16 bits
        total = stored * dense / width if q is None else stored + (n["total"] - quantized) * (dense - width)
    else:
        total = quantized * q["bits"] / 8 + (n["total"] - quantized) * dense if quantized else n["total"] * dense
    label = (precision or stored_dtype) if q is None else (
        f"{q['bits']:g}-bit quantized" if q["bits"] else f"quantized ({q['method']})")
    return {"bytes": int(total), "params": n["total"], "dtype": label,
            "source": INDEX_FILE if stored else "config.json"}


def extraction_peak(config: dict, token_budget: int, engine: str = "transformers", tensor_parallel: int = 1,
                    pipeline_parallel: int = 1, precision: str | None = None, topk_logits: bool = False,
                    max_seq_len: int = 0, stored: int | None = None) -> dict:
    """Predicted peak bytes per device of an extraction forward over ``token_budget`` tokens (``stored``: the
    checkpoint's bytes, `checkpoint_bytes`).

    transformers: the whole target on one device (no parallelism). vllm, sglang (a server,
    eagle3.extract.config.SERVED_ENGINES): weights split over tensor x pipeline ranks, activations over the
    tensor ranks, plus one max_seq_len sample's KV cache."""
    from eagle3.extract.config import SERVED_ENGINES

    h = int(config["hidden_size"])
    inner = int(config.get("moe_intermediate_size") or config["intermediate_size"])
    inner *= int(config.get("num_experts_per_tok") or 1)
    v = int(config.get("vocab_size") or 0)
    served = engine in SERVED_ENGINES
    ranks = tensor_parallel * pipeline_parallel if served else 1
    w = target_weight_bytes(config, precision if engine == "transformers" else None, stored)
    act_dtype = 4 if precision == "float32" else 2
    # Per token: residual stream, norm output, attention in/out (4 H), the MLP's gate/up/act (3 x inner),
    # the captured aux + last (4 H, fp32 copies), and the top-k storage's fp32 logits over V.
    per_token = act_dtype * (4 * h + 3 * inner) / (tensor_parallel if served else 1) + 16 * h
    per_token += 4 * v if topk_logits else 0
    parts = {"weights": w["bytes"] // ranks, "activations": int(per_token * token_budget)}
    if served:
        layers = int(config["num_hidden_layers"])
        nkv = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        hd = int(config.get("head_dim") or h // int(config["num_attention_heads"]))
        kv = 2 * layers * nkv * hd * 2 if not config.get("kv_lora_rank") else layers * (
            int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"])) * 2
        parts["kv cache (one sample)"] = kv * max(max_seq_len, token_budget) // ranks
    parts["runtime"] = RUNTIME_BYTES["cuda"]
    return {"bytes": int(sum(parts.values())), "parts": parts, "weights": w, "ranks": ranks}


def min_tensor_parallel(config: dict, memory: int, token_budget: int, max_seq_len: int,
                        topk_logits: bool = False, most: int = 64, stored: int | None = None) -> int | None:
    """The smallest power-of-two tensor parallel size at which a served engine's extraction fits ``memory`` per
    device."""
    tp = 1
    while tp <= most:
        if extraction_peak(config, token_budget, "vllm", tp, 1, topk_logits=topk_logits,
                           max_seq_len=max_seq_len, stored=stored)["bytes"] <= USABLE_SHARE * memory:
            return tp
        tp *= 2
    return None


# -- the device -----------------------------------------------------------------------------------------------

GPU_MEMORY_ENV = "EAGLE3_GPU_MEMORY_GIB"
"""A deployment's GiB of one GPU-worker device: the DAG reads it at parse time as the device_memory_gib Param's
default (the gate runs on a CPU worker, which cannot measure the GPUs)."""


def device_memory(gib: float | None = None) -> tuple[int, str]:
    """(bytes, where from) of the device a training or extraction task gets: ``gib`` when given ("given"; the
    DAG's Param: the gate runs on a CPU worker, not on the GPU workers), else the smallest GPU that nvidia-smi
    lists on this machine ("cuda"), else this machine's memory ("cpu": CPU training). A GPU split by MIG is
    refused: nvidia-smi's memory.total is the whole GPU's, not a slice's."""
    if gib:
        return int(gib * GiB), "given"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,mig.mode.current",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
            rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]
            if rows:
                if any(r[1:2] == ["Enabled"] for r in rows):
                    from eagle3.errors import InputError

                    raise InputError(f"MIG is enabled: nvidia-smi reports the whole GPU's memory, not a slice's; "
                                     f"set device_memory_gib (or {GPU_MEMORY_ENV}) to one slice's GiB")
                return min(int(r[0]) for r in rows) * 2 ** 20, "cuda"
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    return total, "cpu"


# -- the CPU allocator ------------------------------------------------------------------------------------------

CPU_MALLOC = {"mmap_threshold": 32 * 2 ** 20, "trim_threshold": 256 * 2 ** 20}
"""glibc malloc settings of a CPU training process (`tune_cpu_malloc`). Blocks up to 32 MiB (glibc's ceiling for
the threshold) come from the heap and are reused, instead of each fp32 [Vd, H] lm_head gradient or block of logits
being a fresh mapping whose pages fault again on first touch at every TTT step; up to 256 MiB freed at the heap's
top stays mapped. Measured 2026-12-03 (2 cores, AVX512-BF16; docs/train.md): the bench's step (T=1024, TTT 7,
Vd 8192) 1.05x in bf16, within noise in fp32; the demo's shape (Vd 2048) unchanged: its blocks are small enough for
glibc's defaults (bench/train_bench.py --malloc default,tuned)."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def tune_cpu_malloc(settings: dict | None = None) -> bool:
    """Apply `CPU_MALLOC` to this process's glibc malloc (mallopt); False, changing nothing, where the C library
    has no mallopt (not glibc). A fixed mmap threshold also ends glibc's dynamic one, so what the process keeps
    no longer depends on which tensors it happened to free first."""
    import ctypes

    s = settings or CPU_MALLOC
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, s["mmap_threshold"])) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                   s["trim_threshold"]))


def cpu_malloc_env(settings: dict | None = None) -> dict[str, str]:
    """`CPU_MALLOC` as the environment glibc reads at a process's start (for a process that cannot call
    `tune_cpu_malloc`, e.g. another package's worker measured side by side)."""
    s = settings or CPU_MALLOC
    return {"MALLOC_MMAP_THRESHOLD_": str(s["mmap_threshold"]), "MALLOC_TRIM_THRESHOLD_": str(s["trim_threshold"])}


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


__all__ = ["DraftShape", "training_peak", "largest_budget", "target_params", "target_weight_bytes",
           "checkpoint_bytes", "extraction_peak", "min_tensor_parallel", "device_memory", "GPU_MEMORY_ENV",
           "step_bytes", "step_static_bytes", "USABLE_SHARE", "CPU_MALLOC", "tune_cpu_malloc", "cpu_malloc_env"]
