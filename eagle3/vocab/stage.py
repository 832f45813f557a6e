"""The vocab stage: the draft's Vd-token vocabulary and its mapping to the target's.

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

import hashlib
import json
import logging

import numpy as np

from eagle3 import layout, storage
from eagle3.errors import InputError
from eagle3.merge.arrays import list_parts
from eagle3.vocab.config import VocabConfig

log = logging.getLogger(__name__)


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


def run(cfg: VocabConfig) -> dict:
    """Build (or reuse) VOCAB/vocab.safetensors + vocab.json; returns vocab.json's content."""
    from safetensors.numpy import save

    man_uri = storage.join(cfg.merged, layout.MERGED_MANIFEST)
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
    from eagle3.merge.stage import checked_train_parquet

    loss, every = token_counts(checked_train_parquet(cfg.merged), V)
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
    """(d2t int64 [Vd], t2d bool [V]) of a vocab folder, checked against vocab.json's checksum and sizes."""
    from safetensors.numpy import load

    path, info_uri = storage.join(uri, "vocab.safetensors"), storage.join(uri, "vocab.json")
    if not storage.exists(path) or not storage.exists(info_uri):
        raise InputError(f"no vocab map at {uri} (vocab.safetensors + vocab.json); build it with "
                         f"`eagle3 vocab --merged MERGED --out {uri}`")
    info, data = storage.read_json(info_uri), storage.read_bytes(path)
    want = (info.get("checksums") or {}).get("vocab.safetensors")
    if problem := storage.sha256_problem(path, want, "vocab.json", digest=storage.sha256_bytes(data)):
        raise InputError(f"{problem}: the file changed after it was written; rebuild it with `eagle3 vocab --force`",
                         file=path)
    t = load(data)
    if "d2t" not in t or "t2d" not in t:
        raise InputError(f"lacks d2t/t2d (has {sorted(t)}); rebuild it with `eagle3 vocab --force`", file=path)
    d2t, t2d = t["d2t"].astype(np.int64), t["t2d"].astype(bool)
    if (len(d2t), len(t2d)) != (info.get("draft_vocab_size"), info.get("vocab_size")) or int(t2d.sum()) != len(d2t):
        raise InputError(f"d2t [{len(d2t)}] / t2d [{len(t2d)}, {int(t2d.sum())} set] do not match vocab.json "
                         f"(Vd {info.get('draft_vocab_size')}, V {info.get('vocab_size')}); rebuild it", file=path)
    return d2t, t2d
