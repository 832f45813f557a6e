"""VerifyConfig: what the verify gate checks a merged dataset against (torch- and numpy-free)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3 import storage_options
from eagle3.devices import check_precision
from eagle3.errors import InputError
from eagle3.verify import mode


def _default(config_cls, name: str):
    """A field's default from the stage that owns the setting (one owner per default)."""
    return config_cls.__dataclass_fields__[name].default


from eagle3.config import renamed_fields  # noqa: E402
from eagle3.extract.config import ENGINES as EXTRACT_ENGINES, ExtractConfig, check_engine_storage_option  # noqa: E402
from eagle3.train.config import TrainConfig  # noqa: E402
from eagle3.vocab.config import VocabConfig  # noqa: E402


@renamed_fields
@dataclass(frozen=True)
class VerifyConfig:
    merged: str
    """Merged folder written by `eagle3 merge` (local or s3://)."""
    prepared: str | None = None
    """Prepared folder the merge read; default: the one recorded in manifest.json."""
    model: str | None = None
    """Target model (directory, alias or s3:// prefix): its config.json gives H for the extraction estimate."""
    hidden_size: int | None = None
    """H when no model is given; default: storage_options.REFERENCE_HIDDEN_SIZE."""
    storage_option: str = storage_options.DEFAULT
    """Storage option the store will use; its bytes per token size the estimate."""
    store: str | None = None
    """Where the hidden states will go: extract's store root (its free space is checked, and the samples its store
    for this model, aux layers and option already holds are not priced again); default: the merged folder."""
    aux_layers: tuple[int, ...] | None = None
    """The aux layer ids extract will use (3), for the store's key; None: extract's default [1, L/2-1, L-4]."""
    headroom: float = 1.1
    """The store needs estimated bytes x headroom free."""
    tokens_per_s: float = storage_options.DEFAULT_EXTRACT_TOKENS_PER_S
    """Extraction speed (all shards together) for the hours estimate."""
    max_hours: float | None = None
    """Fail when the estimated extraction time exceeds this (None: report only)."""
    p_threshold: float = 1e-3
    """Family-wise p-value threshold of the uniform-position test (Bonferroni over sources)."""
    expect_seed: int | None = None
    """The shuffle seed this run merged with; the manifest must record it (None: not checked)."""
    expect_max_seq_len: int | None = None
    """The max_seq_len this run merged with (None: not checked)."""
    expect_drop: tuple[str, ...] | None = None
    """The drop list this run merged with; the manifest's dropped datasets must be exactly it (plus the
    expect_manifest's ``drop: true`` ones). None: not checked."""
    expect_manifest: str | None = None
    """The dataset manifest this run merged: its datasets not dropped must be the manifest's sources."""
    expect_sources: tuple[str, ...] | None = None
    """The merged sources, when no expect_manifest gives them (None: not checked)."""
    training_mode: str = mode.DEFAULT
    """offline (extract a store, then train from it), online (the target runs inside training, no store) or
    auto (offline when the store fits the free space at ``store`` with ``headroom``, else online); the verdict's
    ``training_mode`` records the choice, why, and both modes' costs (eagle3.verify.mode)."""
    epochs: int = 1
    """Training epochs, for the cost of both modes (online repeats the target's forward every epoch)."""
    train_tokens_per_s: float = mode.DEFAULT_TRAIN_TOKENS_PER_S
    """Draft training speed for the hours estimate of both modes."""
    target_engine: str = _default(ExtractConfig, "engine")
    """The extraction engine the run will use (transformers: the whole target on one device; vllm or sglang: a
    server split over tensor_parallel_size devices; sglang fills fp8-topk stores only); the memory check
    refuses transformers for a target one device cannot hold, and the hours are priced at this engine's
    measured rate (eagle3/rates.py)."""
    tensor_parallel_size: int = _default(ExtractConfig, "tensor_parallel_size")
    """vllm and sglang engines: devices one replica of the target is split over."""
    extract_token_budget: int = _default(ExtractConfig, "token_budget")
    """Padded tokens per extraction forward, for its activation memory."""
    draft_vocab_size: int = _default(VocabConfig, "draft_vocab_size")
    """Vd, for the training memory (the draft's lm_head, logits and soft labels are Vd wide)."""
    ttt_length: int = _default(TrainConfig, "ttt_length")
    """TTT steps, for the training memory (activations grow with each step)."""
    train_token_budget: int = _default(TrainConfig, "token_budget")
    """Cap on the training micro-batch (padded tokens): the gate picks the largest that fits the device up to
    this (verify.json's memory check ``train_token_budget``, which the DAG hands to train)."""
    checkpoint_ttt_steps: bool = _default(TrainConfig, "checkpoint_ttt_steps")
    """Whether train checkpoints each TTT step (less memory per token)."""
    sequence_parallel: bool = _default(TrainConfig, "sequence_parallel")
    """Whether train splits each micro-batch's positions over its processes (then a device holds 1/train_processes
    of every sample)."""
    train_processes: int = 1
    """Processes (devices) of the train task: what sequence_parallel divides a sample over."""
    precision: str = _default(TrainConfig, "precision")
    """Training precision to size for (auto: bf16 on a GPU, by the CPU's flags on a CPU)."""
    device_memory_gib: float = 0.0
    """Memory of one training/extraction device in GiB (0: the smallest GPU nvidia-smi lists here, else this
    machine's memory). Set it when the gate runs on a CPU worker and the GPUs are elsewhere."""
    devices_elsewhere: bool = False
    """The training and extraction tasks run on other workers than the gate (the DAG: its gpu queue under an
    executor that routes by queue); then a gate that finds no GPU here refuses to size rather than size this
    worker's RAM, unless device_memory_gib is given."""

    def __post_init__(self):
        from eagle3.merge.config import _names

        for name in ("expect_drop", "expect_sources"):  # "a,b", a list, or None (Airflow Params give either)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _names(getattr(self, name)))
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))
        storage_options.option(self.storage_option)
        check_precision(self.precision, "VerifyConfig.precision")
        if self.target_engine not in EXTRACT_ENGINES:
            raise InputError(f"VerifyConfig.target_engine={self.target_engine!r} is not one of "
                             f"{', '.join(EXTRACT_ENGINES)}")
        check_engine_storage_option(self.target_engine, self.storage_option, "VerifyConfig.target_engine",
                                    "VerifyConfig.storage_option")
        for name in ("tensor_parallel_size", "extract_token_budget", "draft_vocab_size", "ttt_length",
                     "train_token_budget", "train_processes"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"VerifyConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.device_memory_gib < 0:
            raise InputError(f"VerifyConfig.device_memory_gib must be >= 0 (0: detect), got {self.device_memory_gib!r}")
        mode.check_mode(self.training_mode, "VerifyConfig.training_mode")
        if self.epochs < 1 or self.train_tokens_per_s <= 0:
            raise InputError(f"need epochs >= 1 and train_tokens_per_s > 0; got {self.epochs}, "
                             f"{self.train_tokens_per_s}")
        if self.model and self.hidden_size:
            raise InputError("VerifyConfig: give model or hidden_size, not both")
        if self.hidden_size is not None and self.hidden_size < 1:
            raise InputError(f"hidden_size must be >= 1, got {self.hidden_size!r}")
        if self.tokens_per_s <= 0 or not 0 < self.p_threshold < 1 or self.headroom < 1:
            raise InputError(f"need tokens_per_s > 0, 0 < p_threshold < 1, headroom >= 1; got "
                             f"{self.tokens_per_s}, {self.p_threshold}, {self.headroom}")

    def resolved_hidden_size(self) -> int:
        return storage_options.estimate_hidden_size(self.model, self.hidden_size)
