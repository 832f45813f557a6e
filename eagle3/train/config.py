"""TrainConfig: every knob of `eagle3 train`, validated on creation (torch-free)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from eagle3 import storage_options
from eagle3.config import DEFAULT_SEED, renamed_fields
from eagle3.devices import check_device, check_precision
from eagle3.draft.config import DEFAULT_DRAFT_VARIANT, DEFAULT_TTT_LENGTH, DRAFT_VARIANTS
from eagle3.extract.config import ENGINES, check_engine_storage_option
from eagle3.errors import InputError

INIT_CHOICES = ("target", "random")
# Optimizer steps timed before a time-budgeted run fixes its step count (the first step is not timed:
# it pays one-time set-up). See TrainConfig.train_time_budget.
BUDGET_PROBE_STEPS = 4
# Steps, and share of the budget's seconds, of the kind that fill the rest of the run (after the first epoch:
# cached in-draft masks) timed before the total is fixed a second time (eagle3/train/budget.py
# `TimeBudget.refit`), and timed again for each later check of the plan. 20 steps alone (4 s of a demo)
# misjudged the rest by 8%: batches differ.
BUDGET_REFIT_STEPS = 20
BUDGET_REFIT_SHARE = 0.05
# After the refit, the plan is fixed again only where the steps' latest speed puts its end further than this
# share of the budget from the budget's end in two checks in a row, or 3x as far in one (load that came or
# went: a demo's 169-s budget ran 224 s).
BUDGET_DRIFT = 0.05


@renamed_fields
@dataclass(frozen=True)
class TrainConfig:
    """One training run. A resumed run takes token_budget/grad_accum from the checkpoint."""

    vocab: str
    """Vocab folder with vocab.safetensors (d2t [Vd], t2d [V]) and vocab.json."""
    out: str
    """Checkpoint folder CKPT (step-<n>/, latest.json, metrics.jsonl); local or s3://."""
    store: str | None = None
    """Hidden-state store (the key folder or a root holding exactly one); local or s3://. Online mode may
    omit it (nothing is then read from or written to a store); offline and write_back need it."""
    merged: str | None = None
    """Merged dataset folder (train.parquet): train on exactly its sample ids (the store may hold more)."""
    model: str | None = None
    """Target model (dir, s3 prefix or alias) for the frozen embedding and lm_head; default: store.json model_name."""
    aux_layers: tuple[int, ...] | None = None
    """When ``store`` is a root holding several stores: the aux layer ids of the one to train on
    (None: the target's default [1, L/2-1, L-4])."""
    storage_option: str = storage_options.DEFAULT
    """When ``store`` is a root holding several stores: the storage option of the one to train on."""
    max_steps: int = 0
    """Stop after this many optimizer steps in total (0: run all epochs)."""
    epochs: int = 1
    """Passes over the training split."""
    ttt_length: int = DEFAULT_TTT_LENGTH
    """Training-time-test steps (the draft's chain length during training)."""
    lr: float = 3e-4
    """Peak learning rate of the cosine schedule."""
    warmup_ratio: float = 0.02
    """Share of the total steps spent in linear warm-up (at least 1 step)."""
    min_lr_ratio: float = 0.1
    """The cosine ends at lr * min_lr_ratio."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = 0.5
    """Max global gradient norm."""
    token_budget: int = 8192
    """Micro-batch size in padded tokens (rows x longest row), per process."""
    grad_accum: int = 1
    """Gradient accumulation factor: a step holds token_budget x grad_accum x processes real tokens."""
    seed: int = DEFAULT_SEED
    """Seeds the draft init and the per-epoch data order."""
    init: str = "target"
    """Fresh draft init: "target" (copy shapes that fit from the target) or "random"."""
    eval_every: int = 100
    """Evaluate on the held-out split every N steps (and at the end); 0: only at the end."""
    heldout_share: float = 0.03
    """Share of samples (by id hash) held out for evaluation."""
    log_every: int = 10
    """Write a metrics line and a progress line every N steps."""
    save_every: int = 100
    """Checkpoint every N steps (and at the end, and on OOM)."""
    keep: int = 2
    """Checkpoints kept."""
    device: str = "auto"
    """"auto" (cuda:LOCAL_RANK when available, else cpu), "cpu" or "cuda"."""
    precision: str = "auto"
    """Compute precision of the draft's forward and backward: bfloat16 runs them under bf16 autocast (master
    weights, optimizer and the target's soft labels stay fp32), float32 without; auto
    (eagle3.devices.resolve_precision) picks bf16 where the machine has a bf16 matrix engine, fp32 elsewhere."""
    online: bool = False
    """Run the target inside training (eagle3.train.online) instead of reading every sample from the store:
    samples the store already holds are read from it, the rest are computed per micro-batch and quantised as
    ``storage_option`` would store them. Needs ``merged`` and ``model``."""
    write_back: bool = False
    """Online mode: also write the samples computed online into the store (shards of task ``online<rank>``),
    so later epochs and later runs read them instead of recomputing them."""
    target_engine: str = "transformers"
    """Online mode: what runs the target: ``transformers`` (in the training process), ``vllm`` (a vLLM
    server in hidden-state extraction mode on its own devices, started and stopped by this run, as
    ``eagle3 extract --engine vllm`` does) or ``sglang`` (an SGLang server, as ``eagle3 extract --engine
    sglang`` does; storage_option fp8-topk only; untested against a real SGLang)."""
    target_tensor_parallel_size: int = 1
    """Online mode, target_engine vllm or sglang: the server's tensor parallel size."""
    prefetch: int = 2
    """Online mode: micro-batches whose target states a background thread computes ahead of the trainer
    (0: compute each when the trainer asks for it)."""

    draft_variant: str = DEFAULT_DRAFT_VARIANT
    """Draft architecture of a fresh run: "eagle3", or "eagle3.1" (an RMSNorm per aux block before fc, and the
    post-norm hidden fed to the next TTT step; vLLM serves it, SGLang does not: docs/draft.md). Recorded in the
    checkpoint's config.json; a resumed run keeps the checkpoint's."""
    parallel_drafting: bool = False
    """P-EAGLE for a fresh run: TTT steps 1.. train parallel slots fed the mask token and a learned mask_hidden,
    so the draft proposes a round's k tokens in one forward (vLLM serves it with `parallel_drafting`; SGLang does
    not: docs/draft.md "P-EAGLE"). Recorded in the checkpoint's config.json; a resumed run keeps the
    checkpoint's."""
    train_time_budget: float = 0.0
    """Seconds of training (0: off; then epochs/max_steps decide). The run times its first optimizer steps,
    then fixes the step count (and so the LR schedule) to what fits in the budget, over as many epochs as
    that takes (``epochs`` is then ignored; ``max_steps`` still caps): a faster machine trains more steps,
    not faster. The fixed count is stored in the checkpoint, so a resumed run keeps the same schedule."""
    train_deadline: float = 0.0
    """UNIX time (s) by which the training loop should end (0: none). When the loop starts, its time budget is the
    longer of train_time_budget and the time left until then (eagle3/train/budget.py `budget_seconds`): the DAG
    sets it from run_time_budget, so a run whose earlier stages were quick (a bf16 engine extracts faster) trains
    longer, and one whose were slow still trains train_time_budget."""
    schedule_from: str | None = None
    """The checkpoint folder (CKPT) of a time-budgeted run: train exactly its step count on its learning-rate curve
    (its warm-up, refit and re-plans: eagle3/train/budget.py `schedule_point`), untimed. For a second draft that
    differs from that run's in one setting (bench/paired_bench.py); exclusive with train_time_budget."""

    draft_window: int = 0
    """Sliding-window draft attention of a fresh run: each query attends the last draft_window positions of its
    sample (0: off, the whole sample). Recorded in the checkpoint's config.json (`sliding_window`) and exported
    for vLLM; SGLang ignores it (docs/train.md "Sliding-window draft attention"). A resumed run keeps the
    checkpoint's."""

    compile: bool = False
    """torch.compile the TTT forward and loss (dynamic shapes; one compile per process, plus one for the
    evaluations' no-grad graph). Measured 1.6x (fp32) to 1.9x (bf16) per step on 2 CPU cores at T=1024, TTT 7
    (bench/peer_bench.py --compile); the first steps pay the compile (about 50 s of CPU here), which a time budget
    counts. Needs a C++ compiler on CPU."""
    sparse_steps: bool = True
    """TTT steps 1.. only at the positions a loss needs (prompts, system turns and tool output carry none),
    where those are at most eagle3.draft.ttt.SPARSE_SHARE of a row: the same loss and gradients up to float
    rounding, fewer FLOPs (docs/train.md "Labels where read, sparse steps"). False runs every step everywhere
    (for measuring)."""
    checkpoint_ttt_steps: bool = False
    """Activation checkpointing per TTT step: backward runs each step's forward again instead of keeping its
    activations (the same loss and gradients). For long samples: at T=8192, TTT 7, bf16 on 2 CPU cores it cut the
    step's peak RSS from 5.67 to 2.89 GiB for +18% CPU time, +46% wall under load (docs/train.md "Long context").
    Off by default: at short lengths it costs the time and memory is not what binds."""

    sequence_parallel: bool = False
    """Split each micro-batch's rows over the processes of a multi-process run (``--nproc``/torchrun) instead of
    giving each process its own samples (eagle3/draft/sequence.py): every process reads the same micro-batches
    and runs the TTT steps on its 1/N of the positions, so one sample N times longer fits per device. The loss
    and gradients equal one process's. Offline only; token_budget then counts the whole group's tokens."""

    def __post_init__(self) -> None:
        positive = ("epochs", "ttt_length", "token_budget", "grad_accum", "keep", "log_every", "save_every")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise InputError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("max_steps", "eval_every", "draft_window"):
            if int(getattr(self, name)) < 0:
                raise InputError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.lr < math.inf:
            raise InputError(f"TrainConfig.lr must be a finite number > 0, got {self.lr!r}")
        if not 0 < self.grad_clip < math.inf:  # 0 would zero every step and a negative max flips the gradient
            raise InputError(f"TrainConfig.grad_clip (the max global gradient norm) must be a finite number > 0, "
                             f"got {self.grad_clip!r}")
        if not 0 <= self.weight_decay < math.inf:
            raise InputError(f"TrainConfig.weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(0 <= float(b) < 1 for b in betas):
            raise InputError(f"TrainConfig.betas needs two values in [0, 1) (AdamW's), got {self.betas!r}; "
                             "e.g. --betas 0.9,0.95")
        if not 0 <= self.heldout_share < 0.5:
            raise InputError(f"TrainConfig.heldout_share must be in [0, 0.5), got {self.heldout_share!r}")
        if not 0 <= self.warmup_ratio < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise InputError("TrainConfig.warmup_ratio must be in [0,1) and min_lr_ratio in [0,1]")
        if self.init not in INIT_CHOICES:
            raise InputError(f"TrainConfig.init={self.init!r} is not one of {', '.join(INIT_CHOICES)}")
        check_device(self.device, "TrainConfig.device")
        check_precision(self.precision, "TrainConfig.precision")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        storage_options.option(self.storage_option)
        if self.online and not (self.merged and self.model):
            raise InputError("TrainConfig.online needs merged (the samples' tokens) and model (the target to run); "
                             "e.g. eagle3 train --online --merged MERGED --model smollm2-135m-instruct ...")
        if self.draft_variant not in DRAFT_VARIANTS:
            raise InputError(f"TrainConfig.draft_variant={self.draft_variant!r} is not one of "
                             f"{', '.join(DRAFT_VARIANTS)}")
        if self.parallel_drafting and self.ttt_length < 2:
            raise InputError(f"TrainConfig.parallel_drafting trains the parallel slots as TTT steps 1..; ttt_length="
                             f"{self.ttt_length} has none: use --ttt-length 2 or more (the deepest slot served)")
        if not self.train_time_budget >= 0:
            raise InputError(f"TrainConfig.train_time_budget must be >= 0 seconds (0: off), "
                             f"got {self.train_time_budget!r}")
        if not self.train_deadline >= 0:
            raise InputError(f"TrainConfig.train_deadline must be a UNIX time in seconds (0: none), "
                             f"got {self.train_deadline!r}")
        if self.schedule_from and (self.train_time_budget or self.train_deadline):
            raise InputError("TrainConfig.schedule_from replays another run's fixed schedule; drop "
                             "train_time_budget/train_deadline (this run is not timed)")
        if self.write_back and not self.online:
            raise InputError("TrainConfig.write_back is for online mode only; add --online")
        if not self.store and (self.write_back or not self.online):
            raise InputError("TrainConfig.store is needed " + ("to write back into" if self.online else
                             "offline (the hidden-state store to train on); pass --store STORE, or train "
                             "--online --merged MERGED --model T without a store"))
        if self.target_engine not in ENGINES:
            raise InputError(f"TrainConfig.target_engine={self.target_engine!r}: choose one of {', '.join(ENGINES)}")
        if self.online:
            check_engine_storage_option(self.target_engine, self.storage_option, "TrainConfig.target_engine",
                                        "TrainConfig.storage_option")
        if not self.online and (self.target_engine != "transformers" or self.target_tensor_parallel_size != 1):
            raise InputError("TrainConfig.target_engine and target_tensor_parallel_size are for online mode "
                             "(offline training reads the store); add --online or drop them")
        if self.sequence_parallel and self.online:
            raise InputError("TrainConfig.sequence_parallel is for offline training (every process would run the "
                             "target on the same samples online); extract a store first, or drop it")
        if self.target_tensor_parallel_size < 1 or self.prefetch < 0:
            raise InputError(f"TrainConfig.target_tensor_parallel_size={self.target_tensor_parallel_size} must be "
                             f">= 1 and prefetch={self.prefetch} >= 0")


def warmup_steps(total: int, cfg: TrainConfig) -> int:
    """Linear warm-up length for a run of ``total`` steps (at least 1)."""
    return warmup_length(total, cfg.warmup_ratio)


def warmup_length(total: int, ratio: float) -> int:
    """``ratio`` of ``total`` steps, at least 1: the one formula of the warm-up's length."""
    return max(1, int(round(ratio * total)))


def lr_at(step: int, total: int, cfg: TrainConfig, warmup: int | None = None) -> float:
    """Linear warm-up, then cosine from lr to lr * min_lr_ratio; a pure function of the step.

    ``warmup`` (default: warmup_steps(total)) is given by time-budgeted runs, whose warm-up is fixed before
    their total is known."""
    import math

    warmup = warmup_steps(total, cfg) if warmup is None else max(1, int(warmup))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
