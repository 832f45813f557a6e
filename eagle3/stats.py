"""Per-dataset token statistics of a prepared folder, and the datasets that cost too much.

For each PREP/<dataset>/tokenized.parquet: samples, tokens (sum, mean, p50, p95,
max), loss tokens, the share of samples at the max_seq_len cap, and the dataset's
share of all samples and of all tokens. A dataset whose token share is far above
its sample share (by default at least 2x and at least 10% of all tokens; the seed's
A1 was 7% of the samples and 32% of the tokens) is flagged with the extraction cost
it adds: tokens (truncated to max_seq_len) x the storage option's bytes per token
(eagle3.storage_options), and hours at a given extraction speed.

Writes PREP/stats_table.json and PREP/stats_table.txt (and copies them to --out).

example:
  eagle3 stats --prepared prep/ --max-seq-len 8192 --model smollm2-135m-instruct --storage-option fp8
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from eagle3 import layout, storage, storage_options
from eagle3.config import DEFAULT_MAX_SEQ_LEN, renamed_fields
from eagle3.errors import InputError
from eagle3.progress import fmt_duration

log = logging.getLogger(__name__)

FLAG_RATIO = 2.0
FLAG_MIN_TOKEN_SHARE = 0.10


@renamed_fields
@dataclass(frozen=True)
class StatsConfig:
    prepared: str
    """Prepared folder PREP written by `eagle3 tokenize` (local or s3://)."""
    manifest: str | None = None
    """Dataset manifest: only its datasets (the prepared folder is shared between runs; None: every dataset in
    it), resolved as merge resolves them."""
    out: str | None = None
    """Also write stats_table.json/.txt here (the run's stats folder)."""
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    """Samples at or above this many tokens count as at the cap; costs count tokens up to it."""
    model: str | None = None
    """Target whose hidden size prices the extraction (its config.json only is read)."""
    hidden_size: int | None = None
    """H when no model is given; default: storage_options.REFERENCE_HIDDEN_SIZE."""
    storage_option: str = storage_options.DEFAULT
    """Storage option the store will use (its bytes per token price the extraction)."""
    tokens_per_s: float = storage_options.DEFAULT_EXTRACT_TOKENS_PER_S
    """Extraction speed (all shards together) for the hours estimate."""
    flag_ratio: float = FLAG_RATIO
    """Flag a dataset whose token share is at least this many times its sample share ..."""
    flag_min_token_share: float = FLAG_MIN_TOKEN_SHARE
    """... and at least this share of all tokens."""

    def __post_init__(self):
        storage_options.option(self.storage_option)
        if self.model and self.hidden_size:
            raise InputError("StatsConfig: give model or hidden_size, not both")
        if self.max_seq_len < 1 or (self.hidden_size is not None and self.hidden_size < 1) or self.tokens_per_s <= 0:
            raise InputError(f"max_seq_len ({self.max_seq_len}), hidden_size ({self.hidden_size}) and "
                             f"tokens_per_s ({self.tokens_per_s}) must be positive")

    def resolved_hidden_size(self) -> int:
        return storage_options.estimate_hidden_size(self.model, self.hidden_size)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _dataset_names(prepared: str, manifest: str | None = None) -> list[str]:
    names = sorted({f.split("/")[0] for f in storage.list_files(prepared) if f.endswith("/tokenized.parquet")
                    and f.count("/") == 1})
    if not names:
        raise InputError(f"no PREP/<dataset>/tokenized.parquet found under {prepared}; run `eagle3 tokenize` first")
    if not manifest:
        return names
    from eagle3.merge.config import MergeConfig

    # the datasets merge will read (its drop list aside: the flags are what suggests dropping one)
    wanted = MergeConfig(prepared, prepared, manifest=manifest).resolved().datasets
    missing = sorted(set(wanted) - set(names))
    if missing:
        raise InputError(f"the manifest's dataset(s) {missing} have no tokenized.parquet under {prepared}; run "
                         "`eagle3 tokenize` on them first", file=manifest)
    return sorted(wanted)


def compute_stats(cfg: StatsConfig, write: bool = True) -> dict[str, Any]:
    """The stats table of ``cfg.prepared`` as records, plus flags; writes stats_table.json/.txt when ``write``."""
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    prepared, max_seq_len, hidden_size = cfg.prepared, cfg.max_seq_len, cfg.resolved_hidden_size()
    tokens_per_s, flag_ratio, flag_min_token_share = cfg.tokens_per_s, cfg.flag_ratio, cfg.flag_min_token_share
    from eagle3.tokenize.stage import check_tokenized

    rows = []
    for name in _dataset_names(prepared, cfg.manifest):
        folder = storage.join(prepared, name)
        meta = storage.read_json(storage.join(folder, layout.PREPARED_STATS)) if storage.exists(
            storage.join(folder, layout.PREPARED_STATS)) else {}
        n = pq.read_table(check_tokenized(folder, meta), columns=["num_tokens", "num_loss_tokens"]).to_pandas()
        tokens = n["num_tokens"].astype("int64")
        rows.append({
            "dataset": name, "category": meta.get("category"), "samples": len(n),
            "tokens": int(tokens.sum()), "tokens_mean": float(tokens.mean()) if len(n) else 0.0,
            "tokens_p50": float(tokens.quantile(0.5)) if len(n) else 0.0,
            "tokens_p95": float(tokens.quantile(0.95)) if len(n) else 0.0,
            "tokens_max": int(tokens.max()) if len(n) else 0,
            "loss_tokens": int(n["num_loss_tokens"].astype("int64").sum()),
            "at_cap_share": float((tokens >= max_seq_len).mean()) if len(n) else 0.0,
            "tokens_after_cap": int(np.minimum(tokens, max_seq_len).sum()),
            "rejected": int(meta.get("rejected", 0)),
        })
    df = pd.DataFrame(rows)
    df["sample_share"] = df["samples"] / max(int(df["samples"].sum()), 1)
    df["token_share"] = df["tokens"] / max(int(df["tokens"].sum()), 1)
    bpt = storage_options.bytes_per_token(cfg.storage_option, hidden_size)
    # A dataset's share of the store (its tokens and their offsets); the total is the store's, priced as the gate does.
    df["extract_bytes"] = storage_options.stored_bytes(bpt, df["tokens_after_cap"], df["samples"], shards=0)
    df["extract_hours"] = df["tokens_after_cap"] / tokens_per_s / 3600
    df["flagged"] = (df["token_share"] >= flag_ratio * df["sample_share"]) & (df["token_share"] >= flag_min_token_share)
    flags = [{
        "dataset": r.dataset, "sample_share": r.sample_share, "token_share": r.token_share,
        "ratio": r.token_share / r.sample_share if r.sample_share else float("inf"),
        "extract_bytes": int(r.extract_bytes), "extract_hours": float(r.extract_hours),
        "message": (f"{r.dataset}: {r.sample_share:.1%} of samples but {r.token_share:.1%} of tokens "
                    f"({r.token_share / r.sample_share:.1f}x); it adds {_fmt_bytes(r.extract_bytes)} and "
                    f"{fmt_duration(r.extract_hours * 3600)} of extraction "
                    f"(H={hidden_size}, {tokens_per_s:,.0f} tok/s). "
                    "Consider max_samples, a lower max_seq_len or dropping it."),
    } for r in df[df["flagged"]].itertuples()]
    result = {
        "prepared": str(prepared), "max_seq_len": max_seq_len, "hidden_size": hidden_size,
        "storage_option": cfg.storage_option, "bytes_per_token": bpt, "tokens_per_s": tokens_per_s,
        "flag_rule": {"ratio": flag_ratio, "min_token_share": flag_min_token_share},
        "datasets": json.loads(df.to_json(orient="records")),
        "totals": {"samples": int(df["samples"].sum()), "tokens": int(df["tokens"].sum()),
                   "loss_tokens": int(df["loss_tokens"].sum()), "extract_bytes": storage_options.stored_bytes(
                       bpt, int(df["tokens_after_cap"].sum()), int(df["samples"].sum())),
                   "extract_hours": float(df["extract_hours"].sum())},
        "flags": flags,
    }
    if write:
        storage.write_json(storage.join(prepared, "stats_table.json"), result)
        storage.write_text(storage.join(prepared, "stats_table.txt"), format_table(result) + "\n")
    return result


def format_table(result: dict[str, Any]) -> str:
    """A fixed-width text table for logs and reports, with the flags underneath."""
    import pandas as pd

    df = pd.DataFrame(result["datasets"])
    view = pd.DataFrame({
        "dataset": df["dataset"], "samples": df["samples"], "tokens": df["tokens"],
        "mean": df["tokens_mean"].round(1), "p50": df["tokens_p50"].round(0).astype(int),
        "p95": df["tokens_p95"].round(0).astype(int), "max": df["tokens_max"], "loss_tok": df["loss_tokens"],
        "at_cap": (df["at_cap_share"] * 100).map("{:.1f}%".format),
        "%samples": (df["sample_share"] * 100).map("{:.1f}%".format),
        "%tokens": (df["token_share"] * 100).map("{:.1f}%".format),
        "extract": df["extract_bytes"].map(_fmt_bytes),
        "flag": df["flagged"].map({True: "<-- FLAG", False: ""}),
    })
    t = result["totals"]
    lines = [view.to_string(index=False),
             f"total: {t['samples']} samples, {t['tokens']} tokens, {t['loss_tokens']} loss tokens; extraction "
             f"~{_fmt_bytes(t['extract_bytes'])}, ~{fmt_duration(t['extract_hours'] * 3600)} "
             f"at {result['tokens_per_s']:,.0f} tok/s "
             f"(H={result['hidden_size']}, {result['storage_option']}: {result['bytes_per_token']} B/token, "
             f"max_seq_len {result['max_seq_len']})"]
    lines += [f"FLAG {f['message']}" for f in result["flags"]]
    return "\n".join(lines)


def stats(cfg: StatsConfig) -> dict[str, Any]:
    """The stats table of the prepared folder (logged, and copied to ``cfg.out``); returns it."""
    result = compute_stats(cfg)
    text = format_table(result)
    if cfg.out:
        storage.write_json(storage.join(cfg.out, "stats_table.json"), result)
        storage.write_text(storage.join(cfg.out, "stats_table.txt"), text + "\n")
    log.info("dataset statistics:\n%s", text)
    return result


def say(cfg: StatsConfig, result: dict[str, Any]) -> str:
    """What `eagle3 stats` prints before the JSON: the table."""
    return format_table(result)
