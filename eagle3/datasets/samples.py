"""A tokenized sample: its content id and the columns of the tokenized Parquet (docs/CONTRACTS.md).

tokenize writes both, merge re-derives the id of a sample it truncated and writes the same
columns plus ``source_id``, verify checks every id, and the hidden-state store is indexed by it.
pyarrow is imported inside ``tokenized_schema`` so ``eagle3 --help`` stays fast.
"""

from __future__ import annotations

import hashlib

import numpy as np


def content_id(ids: np.ndarray, mask: np.ndarray) -> str:
    """sha256[:32] of the int32 little-endian ids bytes followed by the uint8 mask bytes."""
    h = hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(mask, dtype=np.uint8).tobytes())
    return h.hexdigest()[:32]


def tokenized_schema(*extra: str):
    """The tokenized Parquet's columns, then ``extra`` string columns (merge adds ``source_id``)."""
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8())),
                      ("num_tokens", pa.int32()), ("num_loss_tokens", pa.int32()), ("source", pa.string()),
                      *((name, pa.string()) for name in extra)])
