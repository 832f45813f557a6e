"""The merge stage: prepared datasets into one shuffled train.parquet.

What it does, in order:
  1. leaves out the datasets on the drop list (recorded in the manifest);
  2. truncates every sample to --max-seq-len, slicing loss_mask with it;
  3. drops samples left with no loss tokens, then exact duplicates (same
     input_ids and loss_mask after truncation); both counted per source;
  4. shuffles: each kept sample gets the key splitmix64(first 64 bits of its content id
     XOR splitmix64(seed)) and the file is sorted by (key, id): a uniform random order
     per seed that depends only on the data, never on file order or the machine;
  5. writes train.parquet, manifest.json and, with --export-jsonl, the seed
     format train.jsonl ({"input_ids": [...], "loss_mask": [...]} per line).

It works on Arrow columns and numpy, never on Python lists of tokens, and reads each
prepared file once. Memory stays bounded: pass 1 streams record batches and appends
each kept row to one of B bucket files by its key range (a sample's key is known as
soon as it is read); the bucket phase then loads one bucket (about --bucket-mb) at a
time, sorts it, removes duplicates (all copies share a key, so a bucket) and appends it
to the Parquet file.

Example:
  eagle3 merge --prepared PREP --out MERGED --max-seq-len 2048 --seed 42 --drop long_reports
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
import time

import numpy as np

from eagle3 import layout, storage
from eagle3.background import BackgroundWriter, HashingFile, prefetch
from eagle3.config import to_dict
from eagle3.errors import InputError
from eagle3.merge.config import MergeConfig
from eagle3.merge.arrays import (DROP_DUPLICATE, DROP_NO_LOSS, DROP_TRUNCATED_NO_LOSS, content_ids, gather_rows,
                                 list_parts, output_schema, read_batches, rows_table, shuffle_keys, truncate_batch)

log = logging.getLogger(__name__)


def prepared_sources(prepared: str) -> dict[str, str]:
    """{dataset name: URI of its tokenized.parquet}, sorted by name."""
    found = {}
    for rel in storage.list_files(prepared):
        parts = rel.split("/")
        if len(parts) == 2 and parts[1] == layout.PREPARED_PARQUET:
            found[parts[0]] = storage.join(prepared, rel)
    return dict(sorted(found.items()))


def _stats(prepared: str, name: str) -> dict:
    uri = storage.join(prepared, name, layout.PREPARED_STATS)
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


class _Tally:
    """Per-source counts of pass 1 and the bucket phase (everything manifest.json reports)."""

    def __init__(self, name: str, uri: str):
        self.name, self.rec = name, {
            "file": uri, "samples_in": 0, "samples_out": 0, "tokens_in": 0, "tokens_out": 0,
            "loss_tokens_in": 0, "loss_tokens_out": 0,
            "truncated": {"samples": 0, "tokens_cut": 0, "loss_tokens_cut": 0},
            "dropped": {}, "dropped_tokens": {}, "dropped_loss_tokens": {}}

    def seen(self, t) -> None:
        r, tok_out = self.rec, np.diff(t.offsets)
        r["samples_in"] += len(tok_out)
        r["tokens_in"] += int(t.lengths_in.sum())
        r["loss_tokens_in"] += int(t.loss_in.sum())
        r["truncated"]["samples"] += int((tok_out < t.lengths_in).sum())
        r["truncated"]["tokens_cut"] += int((t.lengths_in - tok_out).sum())
        r["truncated"]["loss_tokens_cut"] += int((t.loss_in - t.loss_out).sum())

    def drop(self, reason: str, count: int, tokens: int, loss: int) -> None:
        for key, v in (("dropped", count), ("dropped_tokens", tokens), ("dropped_loss_tokens", loss)):
            self.rec[key][reason] = self.rec[key].get(reason, 0) + int(v)

    def kept(self, count: int, tokens: int, loss: int) -> None:
        self.rec["samples_out"] += int(count)
        self.rec["tokens_out"] += int(tokens)
        self.rec["loss_tokens_out"] += int(loss)


def _bucket_count(sources: dict[str, str], bucket_mb: float) -> int:
    """Buckets so that one holds about bucket_mb of token data (from the Parquet metadata)."""
    import pyarrow.parquet as pq

    total = 0
    for uri in sources.values():
        meta = pq.ParquetFile(storage.local_path(uri)).metadata
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            total += sum(rg.column(c).total_uncompressed_size for c in range(rg.num_columns)
                         if rg.column(c).path_in_schema.split(".")[0] in ("input_ids", "loss_mask", "id"))
    return max(1, math.ceil(total / (bucket_mb * 2**20)))


def _route(sources, cfg: MergeConfig, tallies, drops, tmp: str, n_buckets: int, progress) -> list[str]:
    """Pass 1: truncate, drop no-loss rows, and append every other row to the bucket of its shuffle key.

    Buckets are key ranges, so sorting each bucket by key and writing the buckets in
    order gives the whole shuffled file. Every copy of a duplicate has the same key and
    lands in the same bucket, where the bucket phase removes it.
    """
    import pyarrow as pa

    paths = [os.path.join(tmp, f"bucket-{b:05d}.arrows") for b in range(n_buckets)]
    writers = {}
    try:
        for si, (name, uri) in enumerate(sources.items()):
            for batch in prefetch(read_batches(uri, cfg.batch_rows), name="merge-read"):
                t = truncate_batch(batch, cfg.max_seq_len, uri)
                tallies[name].seen(t)
                progress.update(samples=len(t.lengths_in), tokens=int(t.lengths_in.sum()))
                tok_out = np.diff(t.offsets)
                no_loss = t.loss_out == 0
                for reason, hit in ((DROP_TRUNCATED_NO_LOSS, no_loss & (t.loss_in > 0)),
                                    (DROP_NO_LOSS, no_loss & (t.loss_in == 0))):
                    if hit.any():
                        tallies[name].drop(reason, hit.sum(), tok_out[hit].sum(), 0)
                        drops += [{"source": name, "id": str(s), "reason": reason} for s in t.source_ids[hit]]
                keep = np.flatnonzero(~no_loss)
                if not len(keep):
                    continue
                cids = content_ids(t)[keep]
                keys = shuffle_keys(cids, cfg.seed)
                bucket = ((keys >> np.uint64(32)) * np.uint64(n_buckets)) >> np.uint64(32)
                order = np.argsort(bucket, kind="stable")
                rows = keep[order]
                off, ids, mask = gather_rows(t.offsets, rows, t.ids, t.mask)
                table = rows_table(off, ids, mask, cids[order], t.loss_out[rows], name, t.source_ids[rows],
                                   _key=keys[order], _src=np.full(len(rows), si, np.int16))
                sorted_b = bucket[order]
                for b in np.unique(sorted_b):
                    lo, hi = np.searchsorted(sorted_b, [b, b + 1])
                    if b not in writers:
                        writers[b] = pa.ipc.new_stream(paths[b], table.schema)
                    writers[b].write_table(table.slice(lo, hi - lo))
    finally:
        for w in writers.values():
            w.close()
    return [paths[b] for b in sorted(writers)]


def _write_outputs(bucket_paths, names: list[str], tallies, drops, stage_dir: str,
                   export_jsonl: bool) -> tuple[str, str]:
    """Bucket phase: sort each bucket by (key, id, source, source id), drop duplicates,
    append to train.parquet (and train.jsonl). Returns (content hash, sha256 of train.parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    digest = hashlib.sha256()
    owner = storage.tmp_prefix("train")
    parquet_tmp = os.path.join(stage_dir, f"{owner}parquet{storage.TMP_SUFFIX}")
    jsonl_tmp = os.path.join(stage_dir, f"{owner}jsonl{storage.TMP_SUFFIX}")
    with contextlib.ExitStack() as files:  # closed on any error too
        files.push(lambda *exc: exc[0] is not None and _remove(parquet_tmp, jsonl_tmp))  # on errors, once closed
        sink = files.enter_context(HashingFile(parquet_tmp))
        writer = files.enter_context(pq.ParquetWriter(sink, output_schema(), compression="zstd",
                                                      use_dictionary=["source"],
                                                      write_statistics=["num_tokens", "num_loss_tokens"]))
        jf = files.enter_context(open(jsonl_tmp, "w")) if export_jsonl else None
        with BackgroundWriter(writer.write_table, name="merge-parquet") as background:
            for path in bucket_paths:
                with pa.OSFile(path) as f:
                    table = pa.ipc.open_stream(f).read_all().combine_chunks()
                os.unlink(path)
                storage.kill_point("merge:bucket")
                cid = np.array(table.column("id").to_pylist(), dtype="S32")
                sid = np.array(table.column("source_id").to_pylist(), dtype=object).astype(str)
                src = table.column("_src").to_numpy()
                order = np.lexsort((sid, src, cid, table.column("_key").to_numpy()))
                dup = np.zeros(len(order), bool)
                dup[1:] = cid[order][1:] == cid[order][:-1]
                tok = table.column("num_tokens").to_numpy()
                loss = table.column("num_loss_tokens").to_numpy()
                for r in order[dup]:
                    tallies[names[src[r]]].drop(DROP_DUPLICATE, 1, tok[r], loss[r])
                    drops.append({"source": names[src[r]], "id": sid[r], "reason": DROP_DUPLICATE})
                kept = order[~dup]
                for si in np.unique(src[kept]):
                    sel = kept[src[kept] == si]
                    tallies[names[si]].kept(len(sel), tok[sel].sum(), loss[sel].sum())
                io, ids = list_parts(table.column("input_ids").chunk(0), np.int32)
                _, mask = list_parts(table.column("loss_mask").chunk(0), np.uint8)
                # Gather and write ~1M tokens at a time, so memory stays about one bucket.
                ends = np.cumsum(np.diff(io)[kept])
                cuts = (np.unique(np.searchsorted(ends, np.arange(1, ends[-1] // 2**20 + 1) * 2**20))
                        if len(kept) else [])
                for rows in np.split(kept, cuts):
                    if not len(rows):
                        continue
                    off, g_ids, g_mask = gather_rows(io, rows, ids, mask)
                    background.put(rows_table(off, g_ids, g_mask, cid[rows], loss[rows],
                                              [names[s] for s in src[rows]], sid[rows]))
                    digest.update(b"".join(c + b"\n" for c in cid[rows]))
                    if jf is not None:
                        for a, b in zip(off[:-1], off[1:]):
                            jf.write(json.dumps({"input_ids": g_ids[a:b].tolist(),
                                                 "loss_mask": g_mask[a:b].tolist()}) + "\n")
    storage.kill_point("merge:publish:train.parquet")  # the writers are closed: the files are whole
    os.replace(parquet_tmp, os.path.join(stage_dir, layout.MERGED_PARQUET))
    if export_jsonl:
        os.replace(jsonl_tmp, os.path.join(stage_dir, "train.jsonl"))
    return digest.hexdigest(), sink.sha256.hexdigest()


def checked_train_parquet(merged: str) -> str:
    """The local path of MERGED/train.parquet after checking it against manifest.json's sha256 (for the stages
    that read it after the gate: vocab, extract). InputError naming the file and the repair when it differs;
    a folder without a manifest (a hand-made train.parquet) is read unchecked."""
    path = merged if merged.endswith(".parquet") else storage.join(merged, layout.MERGED_PARQUET)
    folder = path.rsplit("/", 1)[0] if storage.is_s3(path) else os.path.dirname(path)
    man_uri = storage.join(folder, layout.MERGED_MANIFEST)
    want = ((storage.read_json(man_uri).get("checksums") or {}).get(layout.MERGED_PARQUET)
            if storage.exists(man_uri) else None)
    return storage.check_sha256(path, want, f"re-run `eagle3 merge --out {folder}` (and the verify gate)",
                                recorded_in=layout.MERGED_MANIFEST)


def _remove(*paths: str) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


BUCKETS_NAME = "eagle3-merge-buckets"  # the bucket folder: tmp_prefix(BUCKETS_NAME)...TMP_SUFFIX in the temp dir


def _sweep_leftovers(out: str) -> None:
    """Bucket folders and half-written outputs of killed merges (never a live merge's: eagle3.storage.sweep_tmp).
    The old manifest.json (and the gate's verify.json) would describe the old train.parquet, so they go first:
    a merged folder without a manifest is never taken for complete."""
    storage.sweep_tmp(tempfile.gettempdir(), f".{BUCKETS_NAME}.*{storage.TMP_SUFFIX}")
    storage.sweep_tmp(out)
    for name in (layout.MERGED_MANIFEST, layout.VERIFY_RESULT):  # both describe the Parquet about to be replaced
        storage.delete(storage.join(out, name))


def run(cfg: MergeConfig) -> dict:
    """Run the merge stage; returns a small summary (the manifest's totals and hash)."""
    import pyarrow.parquet as pq

    from eagle3.progress import Progress

    t0 = time.monotonic()
    cfg = cfg.resolved()
    sources, dropped = _select(cfg)
    stats = {n: _stats(cfg.prepared, n) for n in {**sources, **dropped}}
    fps = {s.get("tokenizer_fingerprint") for n, s in stats.items() if n in sources} - {None}
    if len(fps) > 1:
        raise InputError(f"datasets under {cfg.prepared!r} were tokenized with different tokenizers {sorted(fps)}; "
                         "tokenize them again with one tokenizer")
    sizes = {int(s["vocab_size"]) for n, s in stats.items() if n in sources and s.get("vocab_size")}
    if len(sizes) > 1:  # V is the target's lm_head rows (eagle3.target.vocab_size): one target per merge
        raise InputError(f"datasets under {cfg.prepared!r} were tokenized for targets of different vocab sizes "
                         f"{sorted(sizes)}; tokenize them again for one target")
    vocab_size = cfg.vocab_size or next(iter(sizes), None)
    from eagle3.tokenize.stage import check_tokenized

    for n in sources:  # each tokenized.parquet against the sha256 its stats.json records, before it is opened
        check_tokenized(storage.join(cfg.prepared, n), stats[n])
    rows = {n: pq.ParquetFile(storage.local_path(u)).metadata.num_rows for n, u in sources.items()}
    progress = Progress("merge", sum(rows.values()), sum(int(stats[n].get("tokens", 0)) for n in sources) or 1)
    tallies = {n: _Tally(n, u) for n, u in sources.items()}
    drops: list[dict] = []
    n_buckets = _bucket_count(sources, cfg.bucket_mb)
    _sweep_leftovers(cfg.out)
    with storage.staged_dir(cfg.out) as stage, tempfile.TemporaryDirectory(
            prefix=storage.tmp_prefix(BUCKETS_NAME), suffix=storage.TMP_SUFFIX) as tmp:
        buckets = _route(sources, cfg, tallies, drops, tmp, n_buckets, progress)
        content_hash, parquet_sha256 = _write_outputs(buckets, list(sources), tallies, drops, str(stage),
                                                      cfg.export_jsonl)
        per_source = {n: t.rec for n, t in tallies.items()}
        checksums = {layout.MERGED_PARQUET: parquet_sha256}  # hashed as it was written
        if cfg.export_jsonl:
            checksums["train.jsonl"] = storage.sha256_file(os.path.join(stage, "train.jsonl"))
        totals = {k: sum(s[k] for s in per_source.values()) for k in
                  ("samples_in", "samples_out", "tokens_in", "tokens_out", "loss_tokens_in", "loss_tokens_out")}
        totals["dropped"] = {}
        for s in per_source.values():
            for r, c in s["dropped"].items():
                totals["dropped"][r] = totals["dropped"].get(r, 0) + c
        if not totals["samples_out"]:  # nothing to train on: fail here, not in a later stage
            reasons = ", ".join(f"{c} {r}" for r, c in sorted(totals["dropped"].items())) or "none read"
            hint = (f"; raise --max-seq-len (now {cfg.max_seq_len}): the cut removed every answer"
                    if totals["dropped"].get("no_loss_tokens_after_truncation") else
                    "; check the datasets' loss masks (tokenize's stats.json counts loss tokens)")
            for name in (layout.MERGED_PARQUET, "train.jsonl"):  # an empty output is no output
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(stage, name))
            raise InputError(f"merge kept 0 of {totals['samples_in']} samples ({reasons}){hint}",
                             file=cfg.prepared)
        manifest = {
            "seed": cfg.seed, "max_seq_len": cfg.max_seq_len, "prepared": cfg.prepared,
            "tokenizer_fingerprint": next(iter(fps), None), "vocab_size": vocab_size,
            "content_hash": content_hash, "content_hash_of": "sha256 over the output sample ids in order, one per line",
            "shuffle": "sorted by (splitmix64(first 64 bits of id ^ splitmix64(seed)), id); see merge_arrays.shuffle_keys",
            "sources": per_source, "drops": drops, "totals": totals, "buckets": n_buckets,
            "dropped_datasets": [{"name": n, "reason": "drop list", "file": u, "samples": int(stats[n].get(
                "samples", pq.ParquetFile(storage.local_path(u)).metadata.num_rows)),
                "tokens": stats[n].get("tokens")} for n, u in dropped.items()],
            "checksums": checksums, "config": to_dict(cfg), "created_by": "eagle3.merge",
        }
        drops.sort(key=lambda d: (d["source"], d["reason"], d["id"]))
        storage.write_json(os.path.join(stage, layout.MERGED_MANIFEST), manifest)
    progress.finish()
    summary = {"out": cfg.out, "samples": totals["samples_out"], "tokens": totals["tokens_out"],
               "loss_tokens": totals["loss_tokens_out"], "dropped": totals["dropped"],
               "dropped_datasets": sorted(dropped), "content_hash": content_hash,
               "seconds": round(time.monotonic() - t0, 3)}
    log.info("merge: %s", summary)
    return summary
