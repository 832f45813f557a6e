"""Merge prepared datasets into one shuffled train.parquet (the `merge` stage).

What it does, in order:
  1. leaves out the datasets on the drop list (recorded in the manifest);
  2. truncates every sample to --max-seq-len, slicing loss_mask with it;
  3. drops samples left with no loss tokens, then exact duplicates (same
     input_ids and loss_mask after truncation); both counted per source;
  4. shuffles: the kept samples are sorted by content id, then permuted with
     numpy's PCG64 seeded by --seed, so the order depends only on the data and
     the seed, never on file order or the machine;
  5. writes train.parquet, manifest.json and, with --export-jsonl, the seed
     format train.jsonl ({"input_ids": [...], "loss_mask": [...]} per line).

It works on Arrow columns and numpy, never on Python lists of tokens, and its
memory stays bounded: pass 1 streams record batches and keeps ~100 bytes of
metadata per sample; pass 2 streams again and routes each truncated row to one
of B bucket files by output position; each bucket (at most --bucket-mb) is
then sorted in memory and appended to the Parquet file.

Example:
  eagle3 merge --prepared PREP --out MERGED --max-seq-len 2048 --seed 42 --drop long_reports
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass

from eagle3 import storage
from eagle3.config import to_dict
from eagle3.errors import InputError
from eagle3.merge_arrays import (DROP_DUPLICATE, DROP_NO_LOSS, DROP_TRUNCATED_NO_LOSS, content_ids, output_schema,
                                 read_batches, shuffle_order, truncate_batch)

log = logging.getLogger(__name__)


def _names(value) -> tuple[str, ...]:
    """Accept "a,b", ["a", "b"] or None (Airflow Params may give either)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    return tuple(v.strip() for v in value if v and v.strip())


@dataclass(frozen=True)
class MergeConfig:
    prepared: str
    """Prepared folder (PREP) holding <dataset>/tokenized.parquet (+ stats.json); local or s3://."""
    out: str
    """Merged folder to write (MERGED); local or s3://."""
    max_seq_len: int = 8192
    """Every sample is cut to this many tokens; its loss_mask is cut with it."""
    seed: int = 42
    """Seed of the shuffle (numpy PCG64)."""
    drop: tuple[str, ...] = ()
    """Dataset names left out of the merge (recorded in manifest.json)."""
    datasets: tuple[str, ...] = ()
    """Only merge these datasets (empty: every dataset in the prepared folder)."""
    export_jsonl: bool = False
    """Also write train.jsonl in the seed format."""
    vocab_size: int | None = None
    """Target vocab size recorded for the vocab stage; default: taken from stats.json when present."""
    batch_rows: int = 2048
    """Rows per streamed record batch."""
    bucket_mb: float = 64
    """Size of one shuffle bucket held in memory at a time; bounds the peak memory."""

    def __post_init__(self):
        object.__setattr__(self, "drop", _names(self.drop))
        object.__setattr__(self, "datasets", _names(self.datasets))
        if int(self.max_seq_len) < 1:
            raise InputError(f"max_seq_len must be >= 1, got {self.max_seq_len!r} (e.g. --max-seq-len 8192)")
        if self.batch_rows < 1 or self.bucket_mb <= 0:
            raise InputError(f"batch_rows must be >= 1 and bucket_mb > 0, got {self.batch_rows}, {self.bucket_mb}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise InputError(f"vocab_size must be >= 1, got {self.vocab_size!r}")


def prepared_sources(prepared: str) -> dict[str, str]:
    """{dataset name: URI of its tokenized.parquet}, sorted by name."""
    found = {}
    for rel in storage.list_files(prepared):
        parts = rel.split("/")
        if len(parts) == 2 and parts[1] == "tokenized.parquet":
            found[parts[0]] = storage.join(prepared, rel)
    return dict(sorted(found.items()))


def _stats(prepared: str, name: str) -> dict:
    uri = storage.join(prepared, name, "stats.json")
    return storage.read_json(uri) if storage.exists(uri) else {}


def _select(cfg: MergeConfig) -> tuple[dict[str, str], dict[str, str]]:
    """Split the prepared datasets into (merged, dropped), refusing unknown names."""
    available = prepared_sources(cfg.prepared)
    if not available:
        raise InputError(f"no <dataset>/tokenized.parquet under {cfg.prepared!r}; run `eagle3 tokenize` first")
    for flag, names in (("--datasets", cfg.datasets), ("--drop", cfg.drop)):
        unknown = sorted(set(names) - set(available))
        if unknown:
            raise InputError(f"{flag} names unknown dataset(s) {unknown}; available: {sorted(available)}")
    chosen = {n: u for n, u in available.items() if not cfg.datasets or n in cfg.datasets}
    dropped = {n: u for n, u in chosen.items() if n in cfg.drop}
    kept = {n: u for n, u in chosen.items() if n not in cfg.drop}
    if not kept:
        raise InputError(f"every dataset is on the drop list {list(cfg.drop)}; nothing left to merge")
    return kept, dropped


class _Meta:
    """Per-sample metadata of pass 1, as growing numpy chunks."""

    def __init__(self):
        self.parts: dict[str, list] = {k: [] for k in
                                       ("cid", "src", "sid", "tok_in", "tok_out", "loss_in", "loss_out")}

    def add(self, **cols):
        for k, v in cols.items():
            self.parts[k].append(v)

    def arrays(self):
        import numpy as np

        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}


def _pass1(sources: dict[str, str], cfg: MergeConfig, progress) -> dict:
    import numpy as np

    meta = _Meta()
    for si, (name, uri) in enumerate(sources.items()):
        for batch in read_batches(uri, cfg.batch_rows):
            t = truncate_batch(batch, cfg.max_seq_len, uri)
            n = len(t.lengths_in)
            meta.add(cid=content_ids(t), src=np.full(n, si, np.int32), sid=t.source_ids.astype("U"),
                     tok_in=t.lengths_in, tok_out=np.diff(t.offsets), loss_in=t.loss_in, loss_out=t.loss_out)
            progress.update(samples=n, tokens=int(t.lengths_in.sum()))
    return meta.arrays()


def _decide(m: dict, seed: int):
    """Drop reasons per sample (None = kept) and the output position of each kept one."""
    import numpy as np

    n = len(m["cid"])
    reason = np.full(n, None, dtype=object)
    no_loss = m["loss_out"] == 0
    reason[no_loss & (m["loss_in"] > 0)] = DROP_TRUNCATED_NO_LOSS
    reason[no_loss & (m["loss_in"] == 0)] = DROP_NO_LOSS
    # Sort by (content id, source, source id): which copy of a duplicate is kept
    # then depends only on content and names, not on file order.
    order = np.lexsort((m["sid"], m["src"], m["cid"]))
    order = order[~no_loss[order]]
    cid_sorted = m["cid"][order]
    dup = np.zeros(len(order), bool)
    dup[1:] = cid_sorted[1:] == cid_sorted[:-1]
    reason[order[dup]] = DROP_DUPLICATE
    kept_sorted = order[~dup]
    pos = np.full(n, -1, np.int64)
    pos[kept_sorted[shuffle_order(len(kept_sorted), seed)]] = np.arange(len(kept_sorted))
    return reason, pos


def _source_summaries(sources, m, reason, cfg) -> tuple[dict, list]:
    import numpy as np

    out, drops = {}, []
    for si, (name, uri) in enumerate(sources.items()):
        sel = m["src"] == si
        kept = sel & (reason == None)  # noqa: E711  (object array: elementwise test)
        rec = {"file": uri,
               "samples_in": int(sel.sum()), "samples_out": int(kept.sum()),
               "tokens_in": int(m["tok_in"][sel].sum()), "tokens_out": int(m["tok_out"][kept].sum()),
               "loss_tokens_in": int(m["loss_in"][sel].sum()), "loss_tokens_out": int(m["loss_out"][kept].sum()),
               "truncated": {"samples": int((sel & (m["tok_in"] > m["tok_out"])).sum()),
                             "tokens_cut": int((m["tok_in"] - m["tok_out"])[sel].sum()),
                             "loss_tokens_cut": int((m["loss_in"] - m["loss_out"])[sel].sum())},
               "dropped": {}, "dropped_tokens": {}, "dropped_loss_tokens": {}}
        for r in (DROP_NO_LOSS, DROP_TRUNCATED_NO_LOSS, DROP_DUPLICATE):
            hit = sel & (reason == r)
            if hit.any():
                rec["dropped"][r] = int(hit.sum())
                rec["dropped_tokens"][r] = int(m["tok_out"][hit].sum())
                rec["dropped_loss_tokens"][r] = int(m["loss_out"][hit].sum())
                drops += [{"source": name, "id": str(s), "reason": r} for s in m["sid"][np.flatnonzero(hit)]]
        out[name] = rec
    return out, drops


def _pass2_buckets(sources, m, pos, cfg, tmp: str, n_buckets: int) -> list[str]:
    """Stream the sources again and append each kept row to its bucket file."""
    import numpy as np
    import pyarrow as pa

    n_out = int((pos >= 0).sum())
    paths = [os.path.join(tmp, f"bucket-{b:05d}.arrows") for b in range(n_buckets)]
    writers = {}
    start = 0
    try:
        for name, uri in sources.items():
            for batch in read_batches(uri, cfg.batch_rows):
                t = truncate_batch(batch, cfg.max_seq_len, uri)
                n = len(t.lengths_in)
                p = pos[start:start + n]
                cid = m["cid"][start:start + n]
                start += n
                keep = np.flatnonzero(p >= 0)
                if not len(keep):
                    continue
                table = t.to_table(cid, name).take(pa.array(keep))
                table = table.append_column("_pos", pa.array(p[keep]))
                bucket = p[keep] * n_buckets // max(n_out, 1)
                for b in np.unique(bucket):
                    part = table.take(pa.array(np.flatnonzero(bucket == b)))
                    if b not in writers:
                        writers[b] = pa.ipc.new_stream(paths[b], part.schema)
                    writers[b].write_table(part)
    finally:
        for w in writers.values():
            w.close()
    return [paths[b] for b in sorted(writers)]


def _write_outputs(bucket_paths, stage_dir: str, export_jsonl: bool) -> str:
    """Sort each bucket by position and append it; returns the content hash."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    digest = hashlib.sha256()
    parquet_tmp = os.path.join(stage_dir, ".train.parquet.tmp")
    jsonl_tmp = os.path.join(stage_dir, ".train.jsonl.tmp")
    writer = None
    jf = open(jsonl_tmp, "w") if export_jsonl else None
    try:
        for path in bucket_paths:
            with pa.OSFile(path) as f:
                table = pa.ipc.open_stream(f).read_all()
            table = table.take(pa.array(np.argsort(table.column("_pos").to_numpy()))).drop_columns(["_pos"])
            table = table.combine_chunks()
            for cid in table.column("id").to_pylist():
                digest.update(cid.encode() + b"\n")
            if writer is None:
                writer = pq.ParquetWriter(parquet_tmp, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=8192)
            if jf is not None:
                _write_jsonl(jf, table)
            os.unlink(path)
    finally:
        if writer is not None:
            writer.close()
        if jf is not None:
            jf.close()
    if writer is None:  # nothing kept: still write an empty, well-typed file
        pq.write_table(output_schema().empty_table(), parquet_tmp)
    os.replace(parquet_tmp, os.path.join(stage_dir, "train.parquet"))
    if export_jsonl:
        os.replace(jsonl_tmp, os.path.join(stage_dir, "train.jsonl"))
    return digest.hexdigest()


def _write_jsonl(f, table) -> None:
    import numpy as np

    ids = table.column("input_ids").chunk(0)
    mask = table.column("loss_mask").chunk(0)
    off = np.asarray(ids.offsets)
    iv, mv = np.asarray(ids.values), np.asarray(mask.values)
    for a, b in zip(off[:-1], off[1:]):
        f.write(json.dumps({"input_ids": iv[a:b].tolist(), "loss_mask": mv[a:b].tolist()}) + "\n")


def merge(cfg: MergeConfig) -> dict:
    """Run the merge stage; returns a small summary (the manifest's totals and hash)."""
    import pyarrow.parquet as pq

    from eagle3.progress import Progress

    t0 = time.monotonic()
    sources, dropped = _select(cfg)
    stats = {n: _stats(cfg.prepared, n) for n in {**sources, **dropped}}
    fps = {s.get("tokenizer_fingerprint") for n, s in stats.items() if n in sources} - {None}
    if len(fps) > 1:
        raise InputError(f"datasets under {cfg.prepared!r} were tokenized with different tokenizers {sorted(fps)}; "
                         "tokenize them again with one tokenizer")
    vocab_size = cfg.vocab_size or next((s["vocab_size"] for s in stats.values() if s.get("vocab_size")), None)
    rows = {n: pq.ParquetFile(storage.local_path(u)).metadata.num_rows for n, u in sources.items()}
    progress = Progress("merge", sum(rows.values()), sum(int(stats[n].get("tokens", 0)) for n in sources) or 1)
    m = _pass1(sources, cfg, progress)
    reason, pos = _decide(m, cfg.seed)
    per_source, drops = _source_summaries(sources, m, reason, cfg)
    n_out = int((pos >= 0).sum())
    tokens_out = int(m["tok_out"][pos >= 0].sum())
    n_buckets = max(1, math.ceil((tokens_out * 5 + n_out * 120) / (cfg.bucket_mb * 2**20)))
    with storage.staged_dir(cfg.out) as stage, tempfile.TemporaryDirectory(prefix="eagle3-merge-") as tmp:
        buckets = _pass2_buckets(sources, m, pos, cfg, tmp, n_buckets)
        content_hash = _write_outputs(buckets, str(stage), cfg.export_jsonl)
        files = ["train.parquet"] + (["train.jsonl"] if cfg.export_jsonl else [])
        checksums = {f: storage.sha256_file(os.path.join(stage, f)) for f in files}
        totals = {k: sum(s[k] for s in per_source.values()) for k in
                  ("samples_in", "samples_out", "tokens_in", "tokens_out", "loss_tokens_in", "loss_tokens_out")}
        totals["dropped"] = {}
        for s in per_source.values():
            for r, c in s["dropped"].items():
                totals["dropped"][r] = totals["dropped"].get(r, 0) + c
        manifest = {
            "seed": cfg.seed, "max_seq_len": cfg.max_seq_len, "prepared": cfg.prepared,
            "tokenizer_fingerprint": next(iter(fps), None), "vocab_size": vocab_size,
            "content_hash": content_hash, "content_hash_of": "sha256 over the output sample ids in order, one per line",
            "shuffle": "sort kept samples by id, then numpy.random.Generator(PCG64(seed)).permutation",
            "sources": per_source, "drops": drops, "totals": totals, "buckets": n_buckets,
            "dropped_datasets": [{"name": n, "reason": "drop list", "file": u, "samples": int(stats[n].get(
                "samples", pq.ParquetFile(storage.local_path(u)).metadata.num_rows)),
                "tokens": stats[n].get("tokens")} for n, u in dropped.items()],
            "checksums": checksums, "config": to_dict(cfg), "created_by": "eagle3.merge",
        }
        storage.write_json(os.path.join(stage, "manifest.json"), manifest)
    progress.finish()
    summary = {"out": cfg.out, "samples": totals["samples_out"], "tokens": totals["tokens_out"],
               "loss_tokens": totals["loss_tokens_out"], "dropped": totals["dropped"],
               "dropped_datasets": sorted(dropped), "content_hash": content_hash,
               "seconds": round(time.monotonic() - t0, 3)}
    log.info("merge: %s", summary)
    return summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prepared", required=True, help="prepared folder from `eagle3 tokenize` (local or s3://)")
    p.add_argument("--out", required=True, help="merged folder to write (local or s3://)")
    p.add_argument("--max-seq-len", type=int, default=8192, help="truncate samples to N tokens (default 8192)")
    p.add_argument("--seed", type=int, default=42, help="shuffle seed (default 42)")
    p.add_argument("--drop", default="", help="comma-separated dataset names to leave out")
    p.add_argument("--datasets", default="", help="comma-separated dataset names to merge (default: all)")
    p.add_argument("--export-jsonl", action="store_true", help="also write train.jsonl in the seed format")
    p.add_argument("--vocab-size", type=int, default=None, help="target vocab size to record for `eagle3 vocab`")
    p.add_argument("--bucket-mb", type=float, default=64, help="shuffle bucket size in MiB (bounds memory)")


def run(args: argparse.Namespace) -> int:
    cfg = MergeConfig(prepared=args.prepared, out=args.out, max_seq_len=args.max_seq_len, seed=args.seed,
                      drop=args.drop, datasets=args.datasets, export_jsonl=args.export_jsonl,
                      vocab_size=args.vocab_size, bucket_mb=args.bucket_mb)
    print(json.dumps(merge(cfg), indent=2))
    return 0

