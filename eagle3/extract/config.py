"""ExtractConfig: every setting of one extraction task (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3 import storage_options
from eagle3.config import renamed_fields
from eagle3.devices import check_device, check_precision
from eagle3.errors import InputError
from eagle3.extract.plan import parse_shard

ENGINES = ("transformers", "vllm", "sglang")
"""What runs the target's forward (``ExtractConfig.engine``)."""
SERVED_ENGINES = ("vllm", "sglang")
"""Engines whose target is a server the task starts on GPUs of its own (tensor/data parallel, quantization)."""
TOPK_ONLY_ENGINES = ("sglang",)
"""Engines that hand over the target's top-k log-probs instead of the final-norm state: fp8-topk stores only."""


def check_engine_storage_option(engine: str, storage_option: str, engine_key: str, option_key: str) -> None:
    """Refuse a storage option ``engine`` cannot fill (InputError naming both settings and the fix)."""
    if engine in TOPK_ONLY_ENGINES and storage_options.option(storage_option).target != "topk":
        topk = next(n for n, o in storage_options.OPTIONS.items() if o.target == "topk")
        raise InputError(
            f"{option_key}={storage_option!r} cannot be filled by {engine_key}={engine!r}: SGLang's /generate "
            f"returns the aux layers and the target's top-k log-probs, not the final-norm state `last` that "
            f"{storage_option!r} stores; use storage_option {topk!r} (DAG Param storage_option, CLI "
            "--storage-option), or engine 'vllm' (DAG Param target_engine)")


@renamed_fields
@dataclass(frozen=True)
class ExtractConfig:
    merged: str
    """Merged folder (holding train.parquet) or the train.parquet itself; local or s3://."""
    model: str
    """Target: HF causal-LM directory, s3:// prefix, or the alias smollm2-135m-instruct."""
    out: str
    """Store root; the store goes into <out>/<model_fp>-L<a>_<b>_<c>-<storage_option>/."""
    shard: str = "0/1"
    """This task's part, I/N: takes the samples whose id hash is I mod N."""
    aux_layers: tuple[int, ...] | None = None
    """Aux layer ids (3); None: [1, L/2-1, L-4]."""
    storage_option: str = storage_options.DEFAULT
    """Storage option (eagle3.storage_options): what each token costs in the store."""
    token_budget: int = 8192
    """Padded tokens per forward pass (batch size x longest sample). Halved after an OOM."""
    shard_mb: float = 256
    """Target shard size in MiB (of per-token payload)."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when a GPU is visible)."""
    precision: str = "auto"
    """Compute precision of the target forward: auto (eagle3.devices.resolve_precision: bf16 where the machine
    has a bf16 matrix engine, CUDA sm80+ or an AMX/AVX512-BF16 CPU; fp32 elsewhere), float32 or bfloat16.
    The store's format does not change with it."""
    tokens_per_s: float | None = None
    """Throughput for the up-front estimate; None: measured on the first batch."""
    lease_root: str | None = None
    """Folder of the GPU lease lock files (eagle3.devices); None: $EAGLE3_LEASE_DIR or /tmp/eagle3-gpu-leases."""
    progress_every_s: float = 10.0
    """Seconds between progress lines."""
    lean_forward: bool = True
    """On CPU, run plain Llama targets through eagle3.extract.lean_llama (same numbers, faster);
    False: always the transformers forward."""
    engine: str = "transformers"
    """What runs the target's forward: ``transformers`` (in this process), ``vllm`` (a vLLM server in
    hidden-state extraction mode) or ``sglang`` (an SGLang server serving the target of an EAGLE-3 draft;
    fp8-topk stores only, untested against a real SGLang); the servers are started and stopped by this task,
    for targets transformers cannot hold. The store is the same either way; store.json and each shard's index
    entry name the engine."""
    tensor_parallel_size: int = 1
    """vllm and sglang engines: GPUs that split every layer of one replica (vLLM's --tensor-parallel-size,
    SGLang's --tp-size)."""
    pipeline_parallel_size: int = 1
    """vllm engine: stages the layers are split into, one GPU group each (--pipeline-parallel-size). SGLang
    captures EAGLE-3 aux states on its last stage only, so the sglang engine refuses it."""
    data_parallel_size: int = 1
    """vllm and sglang engines: replicas, each serving part of the requests (--data-parallel-size,
    --dp-size). The task leases tensor x pipeline x data parallel GPUs."""
    quantization: str | None = None
    """vllm and sglang engines: the server's --quantization (e.g. fp8); None: as the checkpoint is. The stored
    states are then the quantized target's."""
    server_args: tuple[str, ...] = ()
    """vllm and sglang engines: more flags for the server, e.g. ("--gpu-memory-utilization", "0.9"); on the
    command line ``--server-args=--gpu-memory-utilization,0.9``."""
    requests_in_flight: int = 64
    """vllm and sglang engines: samples sent at once (one request each; the server batches them)."""

    def __post_init__(self):
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))
        storage_options.option(self.storage_option)
        parse_shard(self.shard)
        if self.token_budget < 1 or self.shard_mb <= 0:
            raise InputError(f"token_budget={self.token_budget}, shard_mb={self.shard_mb}: need token_budget >= 1 and shard_mb > 0")
        if self.tokens_per_s is not None and not self.tokens_per_s > 0:
            raise InputError(f"ExtractConfig.tokens_per_s={self.tokens_per_s!r}: the estimate's throughput must be > 0 "
                             "(leave it out to measure it on the first batch)")
        check_device(self.device, "ExtractConfig.device")
        check_precision(self.precision, "ExtractConfig.precision")
        if self.engine not in ENGINES:
            raise InputError(f"ExtractConfig.engine={self.engine!r}: choose one of {', '.join(ENGINES)}")
        sizes = {"tensor_parallel_size": self.tensor_parallel_size, "data_parallel_size": self.data_parallel_size,
                 "pipeline_parallel_size": self.pipeline_parallel_size, "requests_in_flight": self.requests_in_flight}
        if bad := {k: v for k, v in sizes.items() if v < 1}:
            raise InputError(f"ExtractConfig: {', '.join(f'{k}={v}' for k, v in bad.items())}: must be >= 1")
        object.__setattr__(self, "server_args", tuple(str(a) for a in self.server_args))
        served = {k: v for k, v in {**sizes, "quantization": self.quantization, "server_args": self.server_args}.items()
                  if k != "requests_in_flight" and v not in (1, None, ())}
        if self.engine not in SERVED_ENGINES and served:
            raise InputError(f"ExtractConfig: {', '.join(f'{k}={v!r}' for k, v in served.items())} only apply to "
                             "engine='vllm' or engine='sglang' (the transformers engine runs on one device); set "
                             "one of them or drop these settings")
        if any(a == "-q" or a.split("=", 1)[0] == "--quantization" for a in self.server_args):
            # the store records ExtractConfig.quantization and refuses a store of another one: keep it true
            raise InputError(f"ExtractConfig.server_args={list(self.server_args)!r} sets the server's quantization; "
                             "set ExtractConfig.quantization (--quantization) instead, which the store records")
        if self.engine == "sglang" and self.pipeline_parallel_size > 1:
            raise InputError(f"ExtractConfig.pipeline_parallel_size={self.pipeline_parallel_size} with "
                             "engine='sglang': SGLang captures EAGLE-3 aux states on its last pipeline stage only "
                             "(set_eagle3_layers_to_capture), so earlier stages' layers would be missing; use "
                             "tensor_parallel_size, or engine='vllm'")
        check_engine_storage_option(self.engine, self.storage_option, "ExtractConfig.engine",
                                    "ExtractConfig.storage_option")

    def gpus(self) -> int:
        """GPUs one task of this config holds (leased when it runs on CUDA)."""
        if self.engine not in SERVED_ENGINES:
            return 1
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size
