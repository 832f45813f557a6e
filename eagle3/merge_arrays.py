"""Column-level pieces of the merge: reading prepared Parquet in record batches,
truncating list columns with numpy, content ids and the seeded shuffle order.

Shared by `eagle3.merge` (which writes) and `eagle3.verify` (which re-derives
the shuffle). pyarrow is imported inside functions so `eagle3 --help` stays fast.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from eagle3 import storage
from eagle3.errors import InputError

DROP_NO_LOSS = "no_loss_tokens"  # the source sample had no assistant token at all
DROP_TRUNCATED_NO_LOSS = "no_loss_tokens_after_truncation"  # cut at max_seq_len before its first loss token
DROP_DUPLICATE = "duplicate"  # same input_ids and loss_mask (after truncation) as a kept sample
REQUIRED = ("id", "input_ids", "loss_mask")


def output_schema():
    """train.parquet columns: the tokenized columns plus `source_id` (the row's id in its prepared file)."""
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8())),
                      ("num_tokens", pa.int32()), ("num_loss_tokens", pa.int32()), ("source", pa.string()),
                      ("source_id", pa.string())])


def content_id(ids: np.ndarray, mask: np.ndarray) -> str:
    """sha256[:32] of the int32 little-endian ids bytes followed by the uint8 mask bytes (CONTRACTS.md)."""
    h = hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(mask, dtype=np.uint8).tobytes())
    return h.hexdigest()[:32]


def shuffle_order(n: int, seed: int) -> np.ndarray:
    """Output order of n samples sorted by content id: output[k] = sorted[order[k]].

    PCG64 gives the same stream on every machine and numpy version that keeps
    its documented stream compatibility for Generator.permutation.
    """
    return np.random.Generator(np.random.PCG64(int(seed))).permutation(n)


def read_batches(uri: str, batch_rows: int, columns=REQUIRED):
    """Record batches of a prepared tokenized.parquet, refusing files without the contract columns."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(storage.local_path(uri))
    missing = [c for c in REQUIRED if c not in pf.schema_arrow.names]
    if missing:
        raise InputError(f"missing column(s) {missing} (has {pf.schema_arrow.names}); "
                         "expected the tokenized format of docs/CONTRACTS.md", file=uri)
    yield from pf.iter_batches(batch_size=batch_rows, columns=list(columns))


def list_parts(col, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(absolute offsets int64, values) of an Arrow list array, zero-copy where possible."""
    offsets = np.asarray(col.offsets, dtype=np.int64)
    values = col.values.to_numpy(zero_copy_only=False)
    return offsets, values.astype(dtype, copy=False)


def segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    cs = np.zeros(len(values) + 1, np.int64)
    np.cumsum(values, out=cs[1:])
    return cs[offsets[1:]] - cs[offsets[:-1]]


@dataclass
class Truncated:
    """One record batch after truncation; flat numpy arrays plus offsets from 0."""
    source_ids: np.ndarray
    ids: np.ndarray  # int32, flat
    mask: np.ndarray  # uint8, flat
    offsets: np.ndarray  # int64 [n+1], offsets[0] == 0
    lengths_in: np.ndarray  # tokens before truncation
    loss_in: np.ndarray  # loss tokens before truncation
    loss_out: np.ndarray  # loss tokens after truncation

    def to_table(self, cids: np.ndarray, source: str):
        import pyarrow as pa

        n = len(self.lengths_in)
        off = pa.array(self.offsets.astype(np.int32))
        schema = output_schema()
        return pa.table([
            pa.array(cids.astype("U32")),
            pa.ListArray.from_arrays(off, pa.array(self.ids, pa.int32())),
            pa.ListArray.from_arrays(off, pa.array(self.mask, pa.uint8())),
            pa.array(np.diff(self.offsets).astype(np.int32)),
            pa.array(self.loss_out.astype(np.int32)),
            pa.array([source] * n, pa.string()),
            pa.array(self.source_ids.astype(str)),
        ], schema=schema)


def truncate_batch(batch, max_len: int, uri: str) -> Truncated:
    """Cut every row of a batch to max_len tokens, slicing loss_mask with the ids."""
    ids_col, mask_col = batch.column("input_ids"), batch.column("loss_mask")
    sids = np.asarray(batch.column("id").to_numpy(zero_copy_only=False))
    if ids_col.null_count or mask_col.null_count:
        raise InputError("null input_ids or loss_mask rows; re-run `eagle3 tokenize`", file=uri)
    io, ids_vals = list_parts(ids_col, np.int32)
    mo, mask_vals = list_parts(mask_col, np.uint8)
    lengths = np.diff(io)
    bad = np.flatnonzero(lengths != np.diff(mo))
    if len(bad):
        r = bad[0]
        raise InputError(f"sample id {sids[r]}: input_ids has {lengths[r]} tokens but loss_mask "
                         f"{mo[r + 1] - mo[r]}; they must match (re-run `eagle3 tokenize`)", file=uri)
    # Re-base both columns on the ids offsets (same lengths, maybe different slices).
    ids_vals, mask_vals = ids_vals[io[0]:io[-1]], mask_vals[mo[0]:mo[-1]]
    offsets = io - io[0]
    if len(mask_vals) and mask_vals.max() > 1:
        r = int(np.searchsorted(offsets, int(np.argmax(mask_vals > 1)), side="right") - 1)
        raise InputError(f"sample id {sids[r]}: loss_mask holds values other than 0/1", file=uri)
    loss_in = segment_sums(mask_vals, offsets)
    new_len = np.minimum(lengths, max_len)
    new_off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(new_len, out=new_off[1:])
    if (lengths > max_len).any():
        # gather index of output token p in row r: p - new_off[r] + offsets[r]
        idx = np.arange(new_off[-1], dtype=np.int64) + np.repeat(offsets[:-1] - new_off[:-1], new_len)
        ids_vals, mask_vals = ids_vals[idx], mask_vals[idx]
        loss_out = segment_sums(mask_vals, new_off)
    else:
        loss_out = loss_in
    return Truncated(sids, ids_vals, mask_vals, new_off, lengths, loss_in, loss_out)


def content_ids(t: Truncated) -> np.ndarray:
    """Content id of every truncated row, as a fixed-width bytes array (sortable, compact)."""
    off = t.offsets
    return np.array([content_id(t.ids[a:b], t.mask[a:b]) for a, b in zip(off[:-1], off[1:])], dtype="S32")


def tokenized_table(input_ids, loss_mask, source: str):
    """A table in the prepared `tokenized.parquet` format from two Arrow list arrays
    (or lists of lists). Used by the merge benchmark's seed-JSONL reader and by tests."""
    import pyarrow as pa

    ids = pa.array(input_ids, pa.list_(pa.int32())) if not isinstance(input_ids, pa.Array) else input_ids
    mask = pa.array(loss_mask, pa.list_(pa.uint8())) if not isinstance(loss_mask, pa.Array) else loss_mask
    ids, mask = ids.cast(pa.list_(pa.int32())), mask.cast(pa.list_(pa.uint8()))
    io, iv = list_parts(ids, np.int32)
    mo, mv = list_parts(mask, np.uint8)
    if not np.array_equal(np.diff(io), np.diff(mo)):
        raise InputError(f"dataset {source!r}: input_ids and loss_mask lengths differ")
    cids = [content_id(iv[a:b], mv[c:d]) for a, b, c, d in zip(io[:-1], io[1:], mo[:-1], mo[1:])]
    n = len(cids)
    return pa.table({"id": pa.array(cids, pa.string()), "input_ids": ids, "loss_mask": mask,
                     "num_tokens": pa.array(np.diff(io).astype(np.int32)),
                     "num_loss_tokens": pa.array(segment_sums(mv[mo[0]:mo[-1]], mo - mo[0]).astype(np.int32)),
                     "source": pa.array([source] * n, pa.string())})
