"""ExtractConfig: every setting of one extraction task (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3 import storage_options
from eagle3.devices import check_device, check_precision
from eagle3.errors import InputError
from eagle3.extract.plan import parse_shard


@dataclass(frozen=True)
class ExtractConfig:
    merged: str
    """Merged folder (holding train.parquet) or the train.parquet itself; local or s3://."""
    model: str
    """Target: HF causal-LM directory, s3:// prefix, or the alias smollm2-135m-instruct."""
    out: str
    """Store root; the store goes into <out>/<model_fp>-L<a>_<b>_<c>-<storage>/."""
    shard: str = "0/1"
    """This task's part, I/N: takes the samples whose id hash is I mod N."""
    layers: tuple[int, ...] | None = None
    """Aux layer ids (3); None: [1, L/2-1, L-4]."""
    storage: str = storage_options.DEFAULT
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

    def __post_init__(self):
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
        storage_options.option(self.storage)
        parse_shard(self.shard)
        if self.token_budget < 1 or self.shard_mb <= 0:
            raise InputError(f"token_budget={self.token_budget}, shard_mb={self.shard_mb}: need token_budget >= 1 and shard_mb > 0")
        check_device(self.device, "ExtractConfig.device")
        check_precision(self.precision, "ExtractConfig.precision")
