"""Storage options of the hidden-state store: which tensors a token costs, and how many bytes.

The one owner of these facts (torch-free): the codec writes exactly these tensors,
the store records the bytes per token, and stats, the verify gate and the DAG's
Params form estimate with the same numbers.

Per token, with H = the target's hidden size and K = TOPK::

    bf16      aux bf16 [3H]; last bf16 [H]                                  8H
    fp8       aux fp8 [3H] + aux_scale bf16 [3]; last fp8 [H] + scale bf16  4H + 8
    fp8-topk  aux fp8 [3H] + aux_scale bf16 [3]; topk_ids int32 [K]
              + topk_logprobs fp16 [K]                                      3H + 6 + 6K

plus ``input_ids`` int32 and ``loss_mask`` uint8 (5 bytes) for every option, and
``offsets`` int64, one per sample and one more per shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.errors import InputError

TOPK = 16
"""Top-k log-probs the fp8-topk option keeps instead of ``last``."""
NUM_AUX = 3
"""Aux layers per token (EAGLE-3 concatenates three)."""
ID_MASK_BYTES = 4 + 1
"""input_ids int32 + loss_mask uint8, stored for every token."""
OFFSET_BYTES = 8
"""One int64 offset per sample, plus one per shard."""

_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int32": 4, "int64": 8, "uint8": 1}


@dataclass(frozen=True)
class Tensor:
    """One per-token tensor of a storage option: name, dtype and width in units of H (plus a constant)."""

    name: str
    dtype: str
    """torch dtype name (no ``torch.`` prefix)."""
    per_h: int = 0
    """Columns per token, as a multiple of the hidden size."""
    extra: int = 0
    """Columns per token that do not scale with H."""

    def columns(self, hidden_size: int) -> int:
        return self.per_h * hidden_size + self.extra

    def bytes(self, hidden_size: int) -> int:
        return self.columns(hidden_size) * _BYTES[self.dtype]


@dataclass(frozen=True)
class StorageOption:
    name: str
    target: str
    """What stands in for the target's next-token distribution: "last" (the final-norm hidden state) or
    "topk" (top-K log-probs)."""
    tensors: tuple[Tensor, ...]
    summary: str
    """One line for help texts and the Params form."""

    def feature_bytes(self, hidden_size: int) -> int:
        return sum(t.bytes(hidden_size) for t in self.tensors)

    def bytes_per_token(self, hidden_size: int) -> int:
        """Feature bytes plus input id and loss mask."""
        return self.feature_bytes(hidden_size) + ID_MASK_BYTES

    @property
    def needs_lm_head(self) -> bool:
        return self.target == "topk"


_FP8_AUX = (Tensor("aux", "float8_e4m3fn", per_h=NUM_AUX), Tensor("aux_scale", "bfloat16", extra=NUM_AUX))
OPTIONS: dict[str, StorageOption] = {
    "bf16": StorageOption("bf16", "last", (Tensor("aux", "bfloat16", per_h=NUM_AUX),
                                           Tensor("last", "bfloat16", per_h=1)),
                          "bf16 aux + last, 8H feature bytes/token (baseline; +5 for id and mask)"),
    "fp8": StorageOption("fp8", "last", _FP8_AUX + (Tensor("last", "float8_e4m3fn", per_h=1),
                                                    Tensor("last_scale", "bfloat16", extra=1)),
                         "fp8 aux + last with per-row scales, 4H+8 feature bytes/token"),
    "fp8-topk": StorageOption("fp8-topk", "topk", _FP8_AUX + (Tensor("topk_ids", "int32", extra=TOPK),
                                                              Tensor("topk_logprobs", "float16", extra=TOPK)),
                              f"fp8 aux + the target's top-{TOPK} log-probs instead of last, "
                              f"3H+{6 + 6 * TOPK} feature bytes/token"),
}
DEFAULT = "bf16"


def option(name: str) -> StorageOption:
    """The option called ``name``; an InputError listing the valid ones otherwise."""
    try:
        return OPTIONS[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown storage option {name!r}; use one of: {', '.join(OPTIONS)}") from None


def bytes_per_token(name: str, hidden_size: int) -> int:
    """Stored bytes per token: the option's features plus input id and loss mask."""
    return option(name).bytes_per_token(hidden_size)


def stored_bytes(per_token: int, tokens: int, samples: int, shards: int = 1) -> int:
    """The extraction cost formula: tensor bytes of ``tokens`` tokens in ``samples`` samples and ``shards``
    shards at ``per_token`` bytes a token (safetensors headers and index files not counted). Stats, the
    verify gate and extract all price a store with it. ``shards=0`` prices one dataset's share of a store."""
    return tokens * per_token + OFFSET_BYTES * (samples + shards)


def store_bytes(name: str, hidden_size: int, tokens: int, samples: int, shards: int = 1) -> int:
    """``stored_bytes`` for storage option ``name`` and hidden size H."""
    return stored_bytes(bytes_per_token(name, hidden_size), tokens, samples, shards)


REFERENCE_HIDDEN_SIZE = 7168
"""H the estimates use when no target is named: a DeepSeek-V3 / Kimi-K2 class model, where the cost matters."""
DEFAULT_EXTRACT_TOKENS_PER_S = 20_000.0
"""Extraction speed the hour estimates assume unless told (a large target on one GPU node)."""


def estimate_hidden_size(model: str | None, hidden_size: int | None) -> int:
    """H for an estimate: the named target's (its config.json only is read), else ``hidden_size``, else
    REFERENCE_HIDDEN_SIZE."""
    if model:
        from eagle3 import target

        return target.config_int(target.read_config(model), "hidden_size", model)
    return hidden_size or REFERENCE_HIDDEN_SIZE


def extraction_estimate(name: str, hidden_size: int, tokens: int, samples: int,
                        tokens_per_s: float = DEFAULT_EXTRACT_TOKENS_PER_S) -> dict:
    """Bytes and hours of extracting ``tokens`` tokens in ``samples`` samples (stats, the gate, extract)."""
    return {"storage_option": name, "hidden_size": hidden_size, "tokens": tokens, "samples": samples,
            "bytes_per_token": bytes_per_token(name, hidden_size),
            "bytes": store_bytes(name, hidden_size, tokens, samples),
            "tokens_per_s": tokens_per_s, "hours": tokens / tokens_per_s / 3600}


def describe() -> str:
    """All options on one line each, for help texts and the Params form."""
    return "; ".join(f"{o.name}: {o.summary}" for o in OPTIONS.values())
