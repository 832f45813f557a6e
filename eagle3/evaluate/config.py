"""EvaluateConfig: what the evaluate stage benchmarks, on which engine (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.devices import check_device, check_precision
from eagle3.errors import InputError
from eagle3.evaluate.lookup import PROPOSERS

BACKENDS = ("transformers", "vllm", "sglang")
COMPARABLE = ("transformers", "vllm")  # backends whose per-prompt acceptance report.json can set side by side


@dataclass(frozen=True)
class EvaluateConfig:
    model: str
    """Target model: local HF dir, s3:// prefix or the alias smollm2-135m-instruct."""
    draft: str
    """Exported draft dir (DRAFT/: config.json + model.safetensors), local or s3://."""
    out: str
    """Output dir EVAL/ for report.json, local or s3://."""
    prompts: str = "humaneval,chat"
    """Comma-separated prompt sets, each "humaneval", "chat" (bundled held-out chat questions) or a JSONL of
    {"prompt"} / {"messages"} lines (local or s3://). The first set's τ is the headline and the publish gate's."""
    steps: int = 3
    """k: draft tokens per target verification (τ is capped at k + 1)."""
    limit: int | None = 20
    """Use only the first N prompts of each set (None: all)."""
    max_new_tokens: int = 128
    """Tokens generated per prompt (the decoders stop at eos too)."""
    checkpoint: str | None = None
    """Trainer CKPT/ whose metrics.jsonl gives the offline simulated τ shown beside the real one."""
    backend: str = "transformers"
    """transformers: the project's decoder in this process; vllm: two vLLM servers (baseline, then EAGLE-3);
    sglang: two SGLang servers on GPUs."""
    compare_with: tuple[str, ...] = ()
    """Also run these backends (transformers, vllm) on the same prompts and set their τ and per-position
    acceptance beside ``backend``'s in report.json, each with a bootstrap interval, flagging a disagreement
    larger than the prompts allow (e.g. ["vllm"]: the project decoder and vLLM side by side)."""
    proposer: str = "draft"
    """transformers only: draft (the EAGLE-3 draft proposes every token) or lookup+draft (a prompt lookup hit,
    eagle3.evaluate.lookup, replaces the draft's token at a chain step; vLLM serves one method per server, so
    neither a vLLM nor an SGLang run, nor a comparison with one, can run this proposer)."""
    vllm_enforce_eager: bool = True
    """vllm: start with --enforce-eager (no torch.compile: measured faster to start here, docs/vllm.md)."""
    device: str = "auto"
    """transformers: auto (cuda if a GPU is visible, else cpu), cpu or cuda[:i]."""
    precision: str = "auto"
    """transformers: the target's precision, the same for the baseline and the speculative decode (so the
    lossless check compares like with like; report.json names it): auto (eagle3.devices.resolve_precision),
    float32 or bfloat16. vllm/sglang: the server's own --dtype."""
    warmup: bool = True
    """Decode the first prompt briefly before timing (first calls pay one-off costs)."""
    threads: int | None = None
    """transformers: torch CPU threads (None: torch's default)."""
    tp: int = 1
    """sglang: tensor-parallel size (GPUs per server)."""
    gpus: tuple[int, ...] | None = None
    """sglang: GPU ids for CUDA_VISIBLE_DEVICES (None: the leased ones)."""
    port: int | None = None
    """vllm / sglang: server port (None: a free one)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InputError(f"EvaluateConfig.backend={self.backend!r} is not one of {', '.join(BACKENDS)}")
        for name in ("steps", "max_new_tokens", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"EvaluateConfig.{name}={value!r} must be an int >= 1 (e.g. --steps 3)")
        for name in ("limit", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InputError(f"EvaluateConfig.{name}={value!r} must be None or an int >= 1")
        if isinstance(self.compare_with, (str, list)):
            object.__setattr__(self, "compare_with", tuple([self.compare_with] if isinstance(self.compare_with, str)
                                                           else self.compare_with))
        wrong = [b for b in self.compare_with if b not in COMPARABLE or b == self.backend]
        if wrong or (self.compare_with and self.backend not in COMPARABLE):
            raise InputError(f"EvaluateConfig.compare_with={list(self.compare_with)!r}: each entry must be one of "
                             f"{', '.join(COMPARABLE)} other than backend={self.backend!r}, and backend must be "
                             f"one of them too (e.g. --backend transformers --compare-with vllm)")
        if self.proposer not in PROPOSERS:
            raise InputError(f"EvaluateConfig.proposer={self.proposer!r} is not one of {', '.join(PROPOSERS)}")
        if self.proposer != "draft" and (self.backend != "transformers" or self.compare_with):
            raise InputError(f"EvaluateConfig.proposer={self.proposer!r} runs in the project decoder only "
                             f"(backend transformers, no compare_with; here backend={self.backend!r}, compare_with="
                             f"{list(self.compare_with)!r}): vLLM and SGLang serve one speculative method per "
                             "server. Use --proposer draft to compare engines")
        check_device(self.device, "EvaluateConfig.device")
        check_precision(self.precision, "EvaluateConfig.precision")
