"""Per-dataset token statistics of a prepared folder, and the datasets that cost too much.

For each PREP/<dataset>/tokenized.parquet: samples, tokens (sum, mean, p50, p95,
max), loss tokens, the share of samples at the max_seq_len cap, and the dataset's
share of all samples and of all tokens. A dataset whose token share is far above
its sample share (by default at least 2x and at least 10% of all tokens; the seed's
A1 was 7% of the samples and 32% of the tokens) is flagged with the extraction cost
it adds: tokens (truncated to max_seq_len) x (8H bytes for bf16 aux [3H] + last [H],
plus 5 bytes of int32 id and uint8 mask), and hours at a given extraction speed.

Writes PREP/stats_table.json and PREP/stats_table.txt.

example:
  eagle3 stats --prepared prep/ --max-seq-len 8192 --hidden-size 7168
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from eagle3 import storage
from eagle3.errors import InputError
from eagle3.progress import fmt_duration

DEFAULT_HIDDEN_SIZE = 7168  # a large target (DeepSeek-V3 / Kimi-K2 class), where the cost matters
DEFAULT_TOKENS_PER_S = 20_000.0  # assumed extraction speed of such a target on one GPU node
ID_MASK_BYTES = 5  # int32 input id + uint8 loss mask per stored token
FLAG_RATIO = 2.0
FLAG_MIN_TOKEN_SHARE = 0.10


def bytes_per_token(hidden_size: int) -> int:
    """bf16 aux [3H] + last [H] = 8H bytes, plus the id and mask."""
    return 8 * hidden_size + ID_MASK_BYTES


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _dataset_names(prepared: str) -> list[str]:
    names = sorted({f.split("/")[0] for f in storage.list_files(prepared) if f.endswith("/tokenized.parquet")
                    and f.count("/") == 1})
    if not names:
        raise InputError(f"no PREP/<dataset>/tokenized.parquet found under {prepared}; run `eagle3 tokenize` first")
    return names


def compute_stats(prepared: str, max_seq_len: int = 8192, hidden_size: int = DEFAULT_HIDDEN_SIZE,
                  tokens_per_s: float = DEFAULT_TOKENS_PER_S, flag_ratio: float = FLAG_RATIO,
                  flag_min_token_share: float = FLAG_MIN_TOKEN_SHARE, write: bool = True) -> dict[str, Any]:
    """The stats table of ``prepared`` as records, plus flags; writes stats_table.json/.txt when ``write``."""
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    if max_seq_len < 1 or hidden_size < 1 or tokens_per_s <= 0:
        raise InputError(f"max_seq_len ({max_seq_len}), hidden_size ({hidden_size}) and tokens_per_s "
                         f"({tokens_per_s}) must be positive")
    rows = []
    for name in _dataset_names(prepared):
        folder = storage.join(prepared, name)
        n = pq.read_table(storage.local_path(storage.join(folder, "tokenized.parquet")),
                          columns=["num_tokens", "num_loss_tokens"]).to_pandas()
        meta = storage.read_json(storage.join(folder, "stats.json")) if storage.exists(
            storage.join(folder, "stats.json")) else {}
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
    bpt = bytes_per_token(hidden_size)
    df["extract_bytes"] = df["tokens_after_cap"] * bpt
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
        "bytes_per_token": bpt, "tokens_per_s": tokens_per_s,
        "flag_rule": {"ratio": flag_ratio, "min_token_share": flag_min_token_share},
        "datasets": json.loads(df.to_json(orient="records")),
        "totals": {"samples": int(df["samples"].sum()), "tokens": int(df["tokens"].sum()),
                   "loss_tokens": int(df["loss_tokens"].sum()), "extract_bytes": int(df["extract_bytes"].sum()),
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
             f"(H={result['hidden_size']}, {result['bytes_per_token']} B/token, max_seq_len {result['max_seq_len']})"]
    lines += [f"FLAG {f['message']}" for f in result["flags"]]
    return "\n".join(lines)


def model_hidden_size(model: str) -> int:
    """``hidden_size`` from a model's config.json (local dir, alias, or s3:// prefix, read without the weights)."""
    if storage.is_s3(model):
        config = storage.read_json(storage.join(model, "config.json"))
    else:
        from eagle3 import target

        config = storage.read_json(storage.join(target.resolve_model(model), "config.json"))
    hidden = config.get("hidden_size") or (config.get("text_config") or {}).get("hidden_size")
    if not isinstance(hidden, int):
        raise InputError(f"model {model!r}: config.json has no integer hidden_size; pass --hidden-size instead")
    return hidden


def run_stats(prepared: str, max_seq_len: int = 8192, model: str | None = None, out: str | None = None,
              hidden_size: int | None = None, tokens_per_s: float = DEFAULT_TOKENS_PER_S) -> dict[str, Any]:
    """compute_stats with the hidden size taken from ``model``; also copies the table files to ``out``.

    Returns the stats dict plus ``table_text`` (the formatted table, for logs).
    """
    hidden = hidden_size or (model_hidden_size(model) if model else DEFAULT_HIDDEN_SIZE)
    result = compute_stats(prepared, max_seq_len=max_seq_len, hidden_size=hidden, tokens_per_s=tokens_per_s)
    text = format_table(result)
    if out:
        storage.write_json(storage.join(out, "stats_table.json"), result)
        storage.write_text(storage.join(out, "stats_table.txt"), text + "\n")
    return {**result, "table_text": text}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prepared", required=True, metavar="PREP", help="prepared folder written by eagle3 tokenize")
    parser.add_argument("--max-seq-len", type=int, default=8192, metavar="N",
                        help="samples at or above N tokens count as at the cap (default 8192)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--hidden-size", type=int, metavar="H",
                      help=f"target hidden size for the extraction cost (default {DEFAULT_HIDDEN_SIZE})")
    size.add_argument("--model", metavar="T", help="read the hidden size from this model's config.json instead")
    parser.add_argument("--out", metavar="DIR",
                        help="also write stats_table.json/.txt here (e.g. the run's stats folder)")
    parser.add_argument("--tokens-per-s", type=float, default=DEFAULT_TOKENS_PER_S, metavar="F",
                        help=f"assumed extraction speed for the hours estimate (default {DEFAULT_TOKENS_PER_S:,.0f})")


def run(args: argparse.Namespace) -> int:
    result = run_stats(args.prepared, max_seq_len=args.max_seq_len, model=args.model, out=args.out,
                       hidden_size=args.hidden_size, tokens_per_s=args.tokens_per_s)
    print(result["table_text"])
    return 0
