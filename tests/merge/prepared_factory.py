"""Prepared folders in the contract format (docs/CONTRACTS.md), written directly with
pyarrow so the merge, verify and vocab tests don't depend on the tokenize stage."""

from __future__ import annotations

import os

import pyarrow.parquet as pq

from eagle3 import storage
from eagle3.merge.arrays import tokenized_table


def write_prepared(root, datasets: dict[str, list[tuple[list, list]]], vocab_size: int = 1000) -> str:
    """root/<name>/tokenized.parquet + stats.json for each dataset; rows are (input_ids, loss_mask)."""
    for name, rows in datasets.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        table = tokenized_table([r[0] for r in rows], [r[1] for r in rows], name)
        pq.write_table(table, os.path.join(root, name, "tokenized.parquet"))
        storage.write_json(os.path.join(root, name, "stats.json"), {
            "dataset": name, "samples": len(rows), "tokens": sum(len(r[0]) for r in rows),
            "tokenizer_fingerprint": "tokfp", "vocab_size": vocab_size})
    return str(root)


def random_rows(rng, n, max_len=40, vocab=1000):
    """n random samples of 2..max_len tokens, each with at least one loss token."""
    rows = []
    for _ in range(n):
        k = int(rng.integers(2, max_len))
        mask = (rng.random(k) < 0.6).astype(int)
        mask[-1] = 1
        rows.append((rng.integers(0, vocab, k).tolist(), mask.tolist()))
    return rows
