"""Vocab map: the draft's Vd-token vocabulary and its mapping to the target's (the `vocab` stage).

Token frequencies are counted at loss_mask == 1 positions of train.parquet
(numpy bincount over the flattened Arrow columns). The Vd most frequent tokens,
sorted by id, form the draft vocab:
  d2t int64 [Vd]: target_id = i + d2t[i]  (what SGLang reads: hot = d2t + arange(Vd))
  t2d bool  [V]:  t2d[target_id] is True for the Vd draft tokens
With fewer distinct loss tokens than Vd, the rest is filled with the most
frequent other tokens of the data (all positions), then with the lowest unused
ids, and vocab.json records how many came from each.

The cache key covers the tokenizer fingerprint, the merged content hash, Vd
and V: a second run with the same key reuses VOCAB/, while any change (Vd in
particular, a known bug of other trainers) rebuilds it.

Example:
  eagle3 vocab --merged MERGED --draft-vocab-size 8192 --out VOCAB
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
from dataclasses import dataclass

import numpy as np

from eagle3 import storage
from eagle3.errors import InputError
from eagle3.merge_arrays import list_parts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VocabConfig:
    merged: str
    """Merged folder written by `eagle3 merge` (local or s3://)."""
    out: str
    """Vocab folder to write (VOCAB); local or s3://."""
    draft_vocab_size: int
    """Vd: tokens in the draft's lm_head."""
    vocab_size: int | None = None
    """V: the target's vocab size; default: `vocab_size` of the merged manifest."""
    force: bool = False
    """Rebuild even when VOCAB/ already holds a map with the same cache key."""

    def __post_init__(self):
        if self.draft_vocab_size < 1:
            raise InputError(f"draft_vocab_size must be >= 1, got {self.draft_vocab_size!r} (e.g. 8192)")
        if self.vocab_size is not None and self.vocab_size < self.draft_vocab_size:
            raise InputError(f"vocab_size {self.vocab_size} is smaller than draft_vocab_size "
                             f"{self.draft_vocab_size}; the draft vocab is a subset of the target's")


def cache_key(tokenizer_fingerprint: str | None, content_hash: str, draft_vocab_size: int, vocab_size: int) -> str:
    text = json.dumps([tokenizer_fingerprint, content_hash, int(draft_vocab_size), int(vocab_size)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def token_counts(train_parquet: str, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts at loss positions, counts at all positions), each int64 [V], streaming by row group."""
    import pyarrow.parquet as pq

    loss = np.zeros(vocab_size, np.int64)
    every = np.zeros(vocab_size, np.int64)
    pf = pq.ParquetFile(train_parquet, pre_buffer=False)  # stream: no whole-file read-ahead
    for batch in pf.iter_batches(batch_size=8192, columns=["input_ids", "loss_mask"]):
        io, ids = list_parts(batch.column("input_ids"), np.int64)
        mo, mask = list_parts(batch.column("loss_mask"), np.uint8)
        ids, mask = ids[io[0]:io[-1]], mask[mo[0]:mo[-1]]
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise InputError(f"token id {int(ids.max())} is outside the target vocab of size {vocab_size}; "
                             "pass the right --vocab-size", file=train_parquet)
        every += np.bincount(ids, minlength=vocab_size)
        loss += np.bincount(ids[mask == 1], minlength=vocab_size)
    return loss, every


def select_tokens(loss: np.ndarray, every: np.ndarray, vd: int) -> tuple[np.ndarray, dict]:
    """The Vd draft tokens sorted by id, and how many came from each fill rule.

    Ties break towards the lower id, so the choice is deterministic.
    """
    ids = np.arange(len(loss))
    # Order: loss count desc, then overall count desc, then id asc.
    order = np.lexsort((ids, -every, -loss))
    chosen = np.sort(order[:vd])
    from_loss = int(min((loss > 0).sum(), vd))
    from_all = int(min(((loss == 0) & (every > 0)).sum(), vd - from_loss))
    return chosen, {"from_loss_tokens": from_loss, "from_other_positions": from_all,
                    "from_lowest_unused_ids": vd - from_loss - from_all}


def build_vocab(cfg: VocabConfig) -> dict:
    """Build (or reuse) VOCAB/vocab.safetensors + vocab.json; returns vocab.json's content."""
    from safetensors.numpy import save

    man_uri = storage.join(cfg.merged, "manifest.json")
    if not storage.exists(man_uri):
        raise InputError(f"{man_uri} not found; run `eagle3 merge --out {cfg.merged}` first")
    man = storage.read_json(man_uri)
    V = cfg.vocab_size or man.get("vocab_size")
    if not V:
        raise InputError(f"{man_uri} has no vocab_size; pass --vocab-size (the target's vocab, e.g. 49152)")
    if cfg.draft_vocab_size > V:
        raise InputError(f"draft_vocab_size {cfg.draft_vocab_size} exceeds the target vocab size {V}")
    key = cache_key(man.get("tokenizer_fingerprint"), man["content_hash"], cfg.draft_vocab_size, V)
    info_uri = storage.join(cfg.out, "vocab.json")
    if not cfg.force and storage.exists(info_uri) and storage.exists(storage.join(cfg.out, "vocab.safetensors")):
        old = storage.read_json(info_uri)
        if old.get("cache_key") == key:
            log.info("vocab: %s has cache key %s; reusing it", cfg.out, key)
            return {**old, "reused": True}
    loss, every = token_counts(storage.local_path(storage.join(cfg.merged, "train.parquet")), V)
    chosen, fill = select_tokens(loss, every, cfg.draft_vocab_size)
    d2t = (chosen - np.arange(len(chosen))).astype(np.int64)
    t2d = np.zeros(V, dtype=bool)
    t2d[chosen] = True
    total_loss = int(loss.sum())
    info = {
        "draft_vocab_size": cfg.draft_vocab_size, "vocab_size": int(V), "cache_key": key,
        "cache_key_inputs": {"tokenizer_fingerprint": man.get("tokenizer_fingerprint"),
                             "content_hash": man["content_hash"], "draft_vocab_size": cfg.draft_vocab_size,
                             "vocab_size": int(V)},
        "distinct_tokens": int((loss > 0).sum()), "loss_tokens": total_loss,
        "coverage": float(loss[chosen].sum() / total_loss) if total_loss else 0.0,
        "fill": fill, "merged": cfg.merged, "reused": False,
    }
    if fill["from_loss_tokens"] < cfg.draft_vocab_size:
        log.warning("vocab: only %d distinct loss tokens for Vd=%d; filled %s", info["distinct_tokens"],
                    cfg.draft_vocab_size, fill)
    sums = {"vocab.safetensors": storage.write_bytes(storage.join(cfg.out, "vocab.safetensors"),
                                                     save({"d2t": d2t, "t2d": t2d}))}
    info["checksums"] = sums
    storage.write_json(info_uri, info)  # written last: its presence marks a complete map
    log.info("vocab: Vd=%d of V=%d covers %.2f%% of loss tokens", cfg.draft_vocab_size, V, 100 * info["coverage"])
    return info


def load_vocab(uri: str) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) of a vocab folder."""
    from safetensors.numpy import load

    t = load(storage.read_bytes(storage.join(uri, "vocab.safetensors")))
    return t["d2t"], t["t2d"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--merged", required=True, help="merged folder from `eagle3 merge` (local or s3://)")
    p.add_argument("--draft-vocab-size", type=int, required=True, help="Vd, e.g. 8192 (32000 for large targets)")
    p.add_argument("--out", required=True, help="vocab folder to write (local or s3://)")
    p.add_argument("--vocab-size", type=int, default=None, help="target vocab size V (default: merged manifest)")
    p.add_argument("--force", action="store_true", help="rebuild even if the cache key matches")


def run(args: argparse.Namespace) -> int:
    info = build_vocab(VocabConfig(merged=args.merged, out=args.out, draft_vocab_size=args.draft_vocab_size,
                                   vocab_size=args.vocab_size, force=args.force))
    print(json.dumps({k: info[k] for k in ("draft_vocab_size", "vocab_size", "coverage", "fill", "reused")}))
    return 0
