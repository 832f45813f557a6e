"""RegenerateConfig: every setting of the regenerate stage (torch- and httpx-free)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3.config import DEFAULT_SEED
from eagle3.devices import check_device, check_precision
from eagle3.errors import Eagle3Error, InputError
from eagle3.target import SMOLLM2_ALIAS

BASE_URL_ENV = "EAGLE3_OPENAI_BASE_URL"
"""The openai backend's server URL when the config names none (the Airflow hook sets it from its connection)."""
API_KEY_ENV = "EAGLE3_OPENAI_API_KEY"
"""Where the openai backend reads its API key by default (never the config or a command line)."""

BACKENDS = ("hf", "openai")
SERVERS = ("sglang", "vllm")


class TooManyErrors(Eagle3Error):
    """More requests failed than ``max_error_share`` allows; a retry resumes where this run stopped."""


@dataclass(frozen=True)
class RegenerateConfig:
    manifest: str
    """The dataset manifest (YAML); datasets with ``regenerate: true`` are regenerated."""
    out: str
    """Output folder (local or s3://): ``<dataset>/regenerated.jsonl``, stats.json, errors.jsonl, manifest.yaml."""
    backend: str = "hf"
    """``hf`` (transformers, in-process; the embedded default) or ``openai`` (any /v1/chat/completions server)."""
    model: str = SMOLLM2_ALIAS
    """hf: model directory or alias. openai: the model name the server serves (sent as ``model``)."""
    datasets: tuple[str, ...] = ()
    """Only these datasets (each must have regenerate: true); empty means all that have it."""
    base_url: str | None = None
    """openai: server URL (``http://h:p`` or ``.../v1``); default $EAGLE3_OPENAI_BASE_URL, then $OPENAI_BASE_URL."""
    api_key_env: str = API_KEY_ENV
    """openai: the environment variable holding the API key (the key itself is never in the config)."""
    concurrency: int = 8
    """openai: requests in flight. hf: the generate batch size."""
    temperature: float = 0.0
    """0 = greedy."""
    top_p: float = 1.0
    max_tokens: int = 512
    """Most tokens per generated turn."""
    seed: int | None = DEFAULT_SEED
    """Sampling seed (sent to the server; seeds torch for hf)."""
    timeout_s: float = 120.0
    """openai: per-request timeout; a timeout is retried."""
    max_retries: int = 6
    """openai: retries of a request after a 429, 5xx, timeout or dropped connection."""
    backoff_s: float = 0.5
    """openai: first retry delay; doubles each retry (with jitter), capped at 30 s."""
    max_error_share: float = 0.05
    """Fail the dataset (TooManyErrors) when more than this share of its conversations failed."""
    price_prompt_per_m: float = 0.0
    """USD per million prompt tokens, for the cost estimate."""
    price_completion_per_m: float = 0.0
    """USD per million completion tokens."""
    device: str = "auto"
    """hf: auto (cuda when a GPU is visible), cpu, cuda or cuda:<i>."""
    precision: str = "auto"
    """hf: the target's compute precision: auto (eagle3.devices.resolve_precision: bf16 where the machine has a
    bf16 matrix engine, fp32 elsewhere), float32 or bfloat16; stats.json records it. Greedy answers differ
    between precisions. openai/server: the server's own (e.g. vLLM --dtype in server_args)."""
    answer_trailing: bool = True
    """Also answer a conversation's last turn when it is a user/tool turn (prompt-only datasets)."""
    restart: bool = False
    """Discard earlier output of the selected datasets instead of resuming it."""
    extra_body: dict | None = None
    """openai: extra JSON fields for every request (e.g. OpenRouter ``provider`` routing)."""
    server: str | None = None
    """Serve ``model`` with this engine for the run and talk to it over the openai path (whatever
    ``backend`` says): "sglang" (on leased GPUs) or "vllm"; it is stopped when the run ends, also when the
    task is killed."""
    server_tp: int = 1
    """server: tensor-parallel size (GPUs leased for it)."""
    server_port: int | None = None
    """server: port on 127.0.0.1 (None: a free one)."""
    server_args: tuple[str, ...] = ()
    """server: extra engine flags, e.g. ("--mem-fraction-static", "0.8")."""

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InputError(f"regenerate: backend={self.backend!r} is not one of {', '.join(BACKENDS)}")
        for name in ("concurrency", "max_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InputError(f"regenerate: {name}={getattr(self, name)!r} must be a positive integer")
        if self.max_retries < 0:
            raise InputError(f"regenerate: max_retries={self.max_retries!r} must be >= 0")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise InputError(f"regenerate: temperature={self.temperature!r} must be >= 0 and "
                             f"top_p={self.top_p!r} in (0, 1]")
        if not 0 <= self.max_error_share <= 1:
            raise InputError(f"regenerate: max_error_share={self.max_error_share!r} must be in [0, 1], e.g. 0.05")
        check_device(self.device, "regenerate: device")
        check_precision(self.precision, "regenerate: precision")
        if self.server is not None and self.server not in SERVERS:
            raise InputError(f"regenerate: server={self.server!r} is not one of {', '.join(SERVERS)}")
        if isinstance(self.datasets, str):
            object.__setattr__(self, "datasets", (self.datasets,))

    def settings(self) -> dict[str, Any]:
        """What each output record says it was made with (these enter the tokenize fingerprint). The seed only
        when sampling: greedy answers do not depend on it, and the run's seed also orders the merge and the
        training, so changing it must not demand a new regeneration."""
        made_with = {"backend": self.backend, "model": self.model, "temperature": self.temperature,
                     "top_p": self.top_p, "max_tokens": self.max_tokens}
        return {**made_with, "seed": self.seed} if self.temperature > 0 else made_with

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_prompt_per_m + completion_tokens * self.price_completion_per_m) / 1e6


