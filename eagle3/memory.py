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

Extraction: the target's weights (by dtype or quantization, split over tensor x pipeline parallel ranks) plus
the forward's activations for the token budget (hidden streams, the MLP's inner width, the captured aux/last
and, for the top-k storage, the [N, V] logits); a served engine (vllm, sglang) also reserves one max_seq_len sample's KV cache.
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

def _quant_bytes(config: dict) -> float | None:
    """Bytes per quantized weight from config.json's quantization_config (None: not quantized)."""
    q = config.get("quantization_config") or {}
    if not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits") or q.get("w_bit")
    for group in (q.get("config_groups") or {}).values():  # compressed-tensors (Kimi-K2's INT4)
        bits = bits or (group.get("weights") or {}).get("num_bits")
    if bits:
        return int(bits) / 8
    return 1.0 if "fp8" in method or method == "fbgemm_fp8" else None


def target_params(config: dict) -> dict:
    """Parameter counts from config.json alone: {"embedding", "layers", "lm_head", "total"}. Dense Llama-style
    attention, or DeepSeek's MLA (q_lora_rank / kv_lora_rank); dense MLP, or MoE (n_routed_experts or
    num_experts, with shared experts and dense first layers)."""
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
    if experts:
        moe_i = int(config.get("moe_intermediate_size") or config["intermediate_size"])
        shared = int(config.get("n_shared_experts") or 0)
        moe_mlp = 3 * h * moe_i * (experts + shared) + h * experts
        dense_layers = int(config.get("first_k_dense_replace") or 0)
        mlp = dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    else:
        mlp = layers * dense_mlp
    body = layers * (attn + 2 * h) + mlp
    head = 0 if config.get("tie_word_embeddings") else v * h
    return {"embedding": v * h, "layers": body, "lm_head": head, "total": v * h + body + head + h}


def target_weight_bytes(config: dict, precision: str | None = None) -> dict:
    """Bytes of the target's weights: {"bytes", "params", "dtype"}. The layers' weights at their quantized
    width when config.json says so, else at ``precision`` (what the transformers engine loads them in; None:
    the checkpoint's torch_dtype); embedding and lm_head at 16 bits (quantizers keep them so) or ``precision``."""
    n = target_params(config)
    stored = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dense = BYTES_PER_DTYPE.get(precision or stored, 2)
    q = _quant_bytes(config)
    layer_bytes = n["layers"] * (q if q is not None else dense)
    edge = (n["embedding"] + n["lm_head"]) * (2 if q is not None and precision is None else dense)
    return {"bytes": int(layer_bytes + edge), "params": n["total"],
            "dtype": f"{q * 8:g}-bit quantized" if q is not None else (precision or stored)}


def extraction_peak(config: dict, token_budget: int, engine: str = "transformers", tensor_parallel: int = 1,
                    pipeline_parallel: int = 1, precision: str | None = None, topk_logits: bool = False,
                    max_seq_len: int = 0) -> dict:
    """Predicted peak bytes per device of an extraction forward over ``token_budget`` tokens.

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
    w = target_weight_bytes(config, precision if engine == "transformers" else None)
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
                        topk_logits: bool = False, most: int = 64) -> int | None:
    """The smallest power-of-two tensor parallel size at which a served engine's extraction fits ``memory`` per
    device."""
    tp = 1
    while tp <= most:
        if extraction_peak(config, token_budget, "vllm", tp, 1, topk_logits=topk_logits,
                           max_seq_len=max_seq_len)["bytes"] <= USABLE_SHARE * memory:
            return tp
        tp *= 2
    return None


# -- the device -----------------------------------------------------------------------------------------------

def device_memory(gib: float | None = None) -> tuple[int, str]:
    """(bytes, where from) of the device a training or extraction task gets: ``gib`` when given (the DAG's
    Param: the gate runs on a CPU worker, not on the GPU workers), else the smallest GPU that nvidia-smi
    lists on this machine, else this machine's memory (CPU training)."""
    if gib:
        return int(gib * GiB), "given"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20).stdout.split()
            if out:
                return min(int(x) for x in out) * 2 ** 20, "cuda"
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
           "extraction_peak", "min_tensor_parallel", "device_memory", "step_bytes", "step_static_bytes",
           "USABLE_SHARE", "CPU_MALLOC", "tune_cpu_malloc", "cpu_malloc_env"]
