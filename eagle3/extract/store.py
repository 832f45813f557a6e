"""The hidden-state store: packed safetensors shards of target features, local or s3://.

Layout (docs/CONTRACTS.md "Hidden-state store")::

    STORE/<model_fp>-L<a>_<b>_<c>-<storage_option>/   (the file rules: eagle3.extract.store_format)
        store.json                      model fingerprint/name, aux_layers, hidden/vocab size, storage_option,
                                        bytes/token, the compute precision and engine of the run that created it
                                        (a writer whose engine quantization differs is refused)
        shard-<task>-<seq>.safetensors  packed samples (no padding), written atomically
        index-<task>.json               {shard: {sha256, bytes, samples, tokens, sample_ids, sample_tokens,
                                                 precision, engine, batch_sizes, batch_offset}}
        adapt-<task>.json               (only after an OOM) the token budget the next run uses

Shard tensors: ``input_ids`` int32 [T], ``loss_mask`` uint8 [T], ``offsets``
int64 [n+1] (sample i is rows offsets[i]:offsets[i+1]) and the per-token
tensors of the storage option (see :mod:`eagle3.extract.codec`: ``aux`` +
``last`` for ``bf16``; fp8 ``aux``/``aux_scale`` + ``last``/``last_scale`` for
``fp8``; fp8 ``aux``/``aux_scale`` + ``topk_ids``/``topk_logprobs`` for
``fp8-topk``). Metadata: ``sample_ids`` (JSON list), ``storage_option``.

The compute precision (eagle3.devices.resolve_precision) changes no stored dtype, so
it is not part of the store key: tasks on machines of different kinds may fill one
store. Each shard's index entry names the precision that computed it, and
``HiddenStateStore.precisions()`` lists them.

Trainer usage — the same code for every option::

    from eagle3.extract.store import HiddenStateStore, target_logprobs
    store = HiddenStateStore("STORE")          # the key folder, or a root holding exactly one
    for sid in store.sample_ids():
        s = store.get(sid)       # {"aux" float [T,3H], "input_ids" int32 [T], "loss_mask" uint8 [T],
                                 #  and "last" [T,H] or "topk_ids"/"topk_logprobs" [T,K]}
        logp = target_logprobs(s, lm_head_weight)   # [T, V] fp32; row t predicts token t+1

``aux`` is bf16 for the ``bf16`` option (memory-mapped) and fp32 for the fp8
options (dequantized); call ``.float()`` either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from eagle3 import storage as st
from eagle3.errors import InputError
from eagle3.extract.codec import decode, target_logprobs
from eagle3.extract.store_format import (FORMAT, STORE_JSON, adapt_name, engine_quantization, identity_diff,
                                         index_name, is_index_name, read_indexes, read_store_json,
                                         resolve_store_dir, shard_seq, store_key, upgraded_store_json)
from eagle3.extract.store_format import shard_name as new_shard_name  # write_shard has a shard_name argument
from eagle3.storage_options import TOPK, bytes_per_token, option

__all__ = ["HiddenStateStore", "StoreWriter", "VerifiedMarks", "store_key", "target_logprobs", "FORMAT"]

log = logging.getLogger(__name__)

_PER_SAMPLE = ("input_ids", "loss_mask", "offsets")


class StoreWriter:
    """Writes shards and the per-task index of one store folder.

    One writer per extraction task; ``task`` names its files (e.g. ``0of4``), so
    N tasks can write into the same folder at once without sharing a file.
    """

    def __init__(self, root: str, *, model_fp: str, model_name: str, aux_layers: list[int], hidden_size: int,
                 vocab_size: int, storage_option: str, task: str, precision: dict | None = None,
                 engine: dict | None = None):
        self.uri = st.join(root, store_key(model_fp, aux_layers, storage_option))
        self.task = task
        self.storage_option = storage_option
        self.info = {
            "format": FORMAT, "model_fingerprint": model_fp, "model_name": model_name,
            "aux_layers": list(aux_layers), "hidden_size": hidden_size, "vocab_size": vocab_size,
            "storage_option": storage_option,
            "topk": TOPK if option(storage_option).target == "topk" else None,
            "bytes_per_token": bytes_per_token(storage_option, hidden_size),
            "precision": precision,
            "engine": engine,  # what ran the forward: name, version, and for vllm/sglang the parallelism
        }
        self._index: dict | None = None

    def open(self) -> "StoreWriter":
        """Create store.json, or check that the existing one describes the same store (one with the keys' old
        names is rewritten with the new ones)."""
        path = st.join(self.uri, STORE_JSON)
        if st.exists(path):
            raw = st.read_json(path)
            old = upgraded_store_json(raw, path)
            diff = identity_diff(old, self.info)
            if diff:
                raise InputError(f"{path} describes another store: {diff} (stored, wanted); "
                                 "use another --out or remove that folder")
            had, wanted = engine_quantization(old), engine_quantization(self.info)
            if had != wanted:  # not in the store key, so a quantized and a plain target would share the folder
                same = f"--quantization {had}" if had else "no --quantization"
                raise InputError(f"this store was filled by the target served with quantization {had!r}, this "
                                 f"task's engine serves it with {wanted!r}: another target, which training would "
                                 f"mix in; extract with {same}, as the store was, or into another store (another "
                                 "--out; in Airflow another storage_root)", file=path)
            if (old.get("precision") or {}).get("name") != (self.info["precision"] or {}).get("name"):
                log.warning("%s was created with %s compute; this task computes in %s (the stored dtypes are the "
                            "same; index-%s.json records each shard's precision)", path,
                            (old.get("precision") or {}).get("name"), (self.info["precision"] or {}).get("name"),
                            self.task)
            if (old.get("engine") or {}).get("name") != (self.info["engine"] or {}).get("name"):
                log.warning("%s was created by the %s engine; this task runs %s (the same store content; "
                            "index-%s.json records each shard's engine)", path, (old.get("engine") or {}).get("name"),
                            (self.info["engine"] or {}).get("name"), self.task)
            if old.keys() != raw.keys():  # written before the rename: the same content under the new keys
                st.write_json(path, old)
        else:
            st.write_json(path, self.info)
        return self

    def index(self) -> dict:
        if self._index is None:
            path = st.join(self.uri, index_name(self.task))
            self._index = st.read_json(path) if st.exists(path) else {}
        return self._index

    def done_ids(self) -> set[str]:
        """Sample ids already stored by ANY task of this store (never extracted again)."""
        return set(read_indexes(self.uri)[1])

    def next_seq(self) -> int:
        """One past the highest shard number of this task (its count when none was ever dropped)."""
        seqs = [shard_seq(n) for n in self.index()]
        return max(seqs, default=-1) + 1

    def drop_shard(self, name: str) -> None:
        """Forget a shard (index entry first, then the file): its samples count as not extracted."""
        self.index().pop(name, None)
        st.write_json(st.join(self.uri, index_name(self.task)), self.index())
        st.delete(st.join(self.uri, name))

    def drop_bad_shards_of_others(self, sample_ids) -> dict[str, str]:
        """Verify the shards of the OTHER indexes of this store (other tasks, another --shard count, online
        write-back) that hold one of ``sample_ids``, and drop from its index each whose file is missing or fails
        its sha256 (on S3 its size: :func:`corrupted_shards` ``by_size``): its samples then count as not
        extracted, so the tasks they belong to extract them again (``done_ids`` trusts every index, and only an
        index's own task repairs its shards in place).
        Returns {shard: what was wrong}.

        Tasks of one store run at once, so: a shard is dropped only when it is bad twice, the second time just
        before the rewrite with its entry unchanged (its owner may be repairing it in place right now); the
        index is re-read and rewritten atomically; the file stays (an owner's repair may be renaming over it).
        """
        wanted, dropped = set(sample_ids), {}
        for name in sorted(st.list_files(self.uri)):
            if not is_index_name(name) or name == index_name(self.task):
                continue
            path = st.join(self.uri, name)
            mine = {k: e for k, e in st.read_json(path).items() if not wanted.isdisjoint(e["sample_ids"])}
            if not (bad := corrupted_shards(self.uri, mine, use_marks=True, by_size=True)):
                continue
            now = st.read_json(path)
            bad = corrupted_shards(self.uri, now, [k for k in bad if now.get(k) == mine[k]], by_size=True)
            if bad:
                st.write_json(path, {k: e for k, e in now.items() if k not in bad})
                log.warning("extract: dropped %d corrupted shard(s) from %s (%s); their samples count as not "
                            "extracted, the files are left in place", len(bad), path,
                            ", ".join(f"{k}: {why}" for k, why in bad.items()))
                dropped.update(bad)
        return dropped

    def adapt_path(self) -> str:
        return st.join(self.uri, adapt_name(self.task))

    def write_shard(self, samples: list[dict], shard_name: str | None = None, *,
                    batch_sizes: tuple[int, ...] | None = None, batch_offset: int = 0) -> dict:
        """Write one shard atomically, then record it in the task index.

        samples: dicts with ``id``, ``input_ids``, ``loss_mask`` (1-D tensors of
        length T_i) and ``tensors`` (per-token tensors [T_i, ...] from
        :func:`eagle3.extract.codec.encode`). ``shard_name``: rewrite that shard (a repair) instead of
        adding the next one. ``batch_sizes``, ``batch_offset``: the batches of the extraction plan that held
        these samples (eagle3.extract.plan.ShardPlan), recorded so that a resume or a repair forwards them
        in the same batches. Returns the index entry.
        """
        import torch

        if not samples:
            raise ValueError("write_shard needs at least one sample")
        names = sorted(samples[0]["tensors"])
        lengths = [int(s["input_ids"].numel()) for s in samples]
        offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor(lengths).cumsum(0)
        tensors = {
            "input_ids": torch.cat([s["input_ids"].to(torch.int32).cpu() for s in samples]),
            "loss_mask": torch.cat([s["loss_mask"].to(torch.uint8).cpu() for s in samples]),
            "offsets": offsets,
        }
        for name in names:
            tensors[name] = torch.cat([s["tensors"][name] for s in samples]).contiguous()
        ids = [s["id"] for s in samples]
        meta = {"sample_ids": json.dumps(ids), "storage_option": self.storage_option, "format": FORMAT}
        name = shard_name or new_shard_name(self.task, self.next_seq())
        digest, size = _atomic_save(self.uri, name, lambda p: save_safetensors(tensors, p, meta))
        # bytes: an S3 shard is checked by its size (one HEAD), not downloaded and hashed (corrupted_shards)
        entry = {"sha256": digest, "bytes": size, "samples": len(ids), "tokens": int(offsets[-1]),
                 "sample_ids": ids, "sample_tokens": lengths,
                 "precision": (self.info["precision"] or {}).get("name"), "engine": self.info["engine"]}
        if batch_sizes is not None:
            entry.update(batch_sizes=list(batch_sizes), batch_offset=int(batch_offset))
        self.index()[name] = entry
        st.write_json(st.join(self.uri, index_name(self.task)), self.index())
        return entry


_DTYPES = {  # torch dtype name -> safetensors dtype tag
    "bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def save_safetensors(tensors: dict, path: str, metadata: dict[str, str]) -> None:
    """Write a safetensors file with a byte-for-byte deterministic header.

    safetensors' own writer emits ``__metadata__`` in hash-map order, which
    changes between processes; resumed extraction must reproduce the exact
    bytes of an uninterrupted run, so the header is written here with sorted
    keys. Tensors go widest dtype first, so every tensor stays aligned.
    """
    import torch

    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    start = 0
    for k in order:
        t = tensors[k]
        n = t.numel() * t.element_size()
        header[k] = {"dtype": _DTYPES[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                     "data_offsets": [start, start + n]}
        start += n
    raw = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    raw += b" " * (-len(raw) % 8)  # data must start 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for k in order:
            t = tensors[k].detach().cpu().contiguous()
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _atomic_save(dir_uri: str, name: str, save) -> tuple[str, int]:
    """Run ``save(local_path)`` and publish the file at dir_uri/name atomically; return its sha256 and size."""
    with st.atomic_file(st.join(dir_uri, name)) as tmp:
        save(str(tmp))
        return st.sha256_file(tmp), os.path.getsize(tmp)


class HiddenStateStore:
    """Read-only, memory-mapped access to a store (local or s3://; s3 shards are cached locally)."""

    def __init__(self, uri: str, key: str | None = None):
        self.uri = resolve_store_dir(str(uri), key)
        self.info = read_store_json(self.uri)
        self.storage_option = self.info["storage_option"]
        self.aux_layers = self.info["aux_layers"]
        self.hidden_size = self.info["hidden_size"]
        self.shards, self._where = read_indexes(self.uri)
        self._open: dict = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self._where

    def sample_ids(self) -> list[str]:
        """All stored sample ids, in store order (index name, shard name, position)."""
        return list(self._where)

    def num_tokens(self, sample_id: str) -> int:
        shard, i = self._locate(sample_id)
        return int(self.shards[shard]["sample_tokens"][i])

    def precisions(self) -> dict[str, int]:
        """{compute precision: stored tokens} over the shards (None: written before the index recorded it)."""
        out: dict = {}
        for e in self.shards.values():
            out[e.get("precision")] = out.get(e.get("precision"), 0) + int(e["tokens"])
        return out

    def engines(self, sample_ids=None) -> dict[str, int]:
        """{engine name: stored tokens} over the shards, or over ``sample_ids`` alone (None: written before the
        index recorded it)."""
        out: dict = {}
        if sample_ids is None:
            for e in self.shards.values():
                name = (e.get("engine") or {}).get("name")
                out[name] = out.get(name, 0) + int(e["tokens"])
            return out
        for sid in sample_ids:
            shard, i = self._locate(sid)
            name = (self.shards[shard].get("engine") or {}).get("name")
            out[name] = out.get(name, 0) + int(self.shards[shard]["sample_tokens"][i])
        return out

    def total_tokens(self) -> int:
        return sum(int(e["tokens"]) for e in self.shards.values())

    def _locate(self, sample_id: str) -> tuple[str, int]:
        try:
            return self._where[sample_id]
        except KeyError:
            raise KeyError(f"sample {sample_id!r} is not in the store {self.uri}") from None

    def _handle(self, shard: str):
        if shard not in self._open:
            from safetensors import SafetensorError, safe_open

            uri = st.join(self.uri, shard)
            try:
                f = safe_open(st.local_path(uri), framework="pt")
                offsets = f.get_tensor("offsets").tolist()
            except (SafetensorError, OSError) as e:  # truncated, overwritten or gone since the index was written
                raise InputError(f"shard unreadable ({type(e).__name__}: {e}); {REPAIR}", file=uri) from e
            if len(offsets) != int(self.shards[shard]["samples"]) + 1:
                raise InputError(f"shard holds {len(offsets) - 1} samples, its index entry {self.shards[shard]['samples']}"
                                 f"; {REPAIR}", file=uri)
            self._open[shard] = (f, offsets)
        return self._open[shard]

    def get_raw(self, sample_id: str) -> dict:
        """The stored tensors of one sample, undecoded (memory-mapped slices)."""
        shard, i = self._locate(sample_id)
        f, offsets = self._handle(shard)
        a, b = offsets[i], offsets[i + 1]
        return {k: f.get_slice(k)[a:b] for k in f.keys() if k != "offsets"}

    def get_tensor(self, sample_id: str, name: str):
        """One stored tensor of one sample, undecoded, without reading the others (e.g. ``loss_mask``)."""
        shard, i = self._locate(sample_id)
        f, offsets = self._handle(shard)
        return f.get_slice(name)[offsets[i]: offsets[i + 1]]

    def get(self, sample_id: str) -> dict:
        """One sample: ``aux``, ``input_ids``, ``loss_mask`` and ``last`` or ``topk_ids``/``topk_logprobs``."""
        raw = self.get_raw(sample_id)
        out = decode(self.storage_option, raw)
        out.update(input_ids=raw["input_ids"], loss_mask=raw["loss_mask"])
        return out

    def verify(self, shards=None, *, use_marks: bool = False) -> list[str]:
        """Check the sha256 of ``shards`` (default: all) against the index; returns the problems (empty when
        all match). ``use_marks``: skip a shard this machine already verified unchanged (same size, mtime
        and inode, :class:`VerifiedMarks`); ``$EAGLE3_VERIFY=always`` turns the marks off."""
        bad = corrupted_shards(self.uri, self.shards, shards, use_marks=use_marks)
        return [f"{st.join(self.uri, name)}: {why}" for name, why in bad.items()]

    def shards_of(self, sample_ids) -> list[str]:
        """The shards holding these samples."""
        return sorted({self._locate(sid)[0] for sid in sample_ids})

    def check(self, sample_ids=None) -> None:
        """Verify the shards a stage is about to read (default: all) before it uses them: each shard's
        sha256 against the index, once per unchanged file on this machine (:meth:`verify` with marks).
        Raises InputError naming every bad shard and the repair."""
        shards = None if sample_ids is None else self.shards_of(sample_ids)
        t0 = time.monotonic()
        problems = self.verify(shards, use_marks=True)
        log.info("store %s: %d shards checked against their sha256 in %.1fs", self.uri,
                 len(self.shards if shards is None else shards), time.monotonic() - t0)
        if problems:
            raise InputError(f"{len(problems)} corrupted hidden-state shard(s): " + "; ".join(problems[:5])
                             + f"; {REPAIR}", file=self.uri)


REPAIR = ("re-run `eagle3 extract` with the same --merged/--out (without --shard, or all I/N of any N): it "
          "re-extracts the samples of every shard that is missing or whose sha256 does not match its index")
VERIFY_ENV = "EAGLE3_VERIFY"


PROGRESS_EVERY_S = 10.0  # between the lines of a long check


def corrupted_shards(uri: str, entries: dict, names=None, *, use_marks: bool = False,
                     by_size: bool = False) -> dict[str, str]:
    """{shard: what is wrong} for the shards ``names`` (default: all of ``entries``, {shard: index entry})
    whose file is missing or whose sha256 differs from its entry.

    ``use_marks``: a shard this machine verified unchanged is not hashed again (:class:`VerifiedMarks`).
    ``by_size`` (extract's own checks): on S3, a shard whose entry records its size is checked by one HEAD,
    that the object is there with that size, and is not downloaded. S3 guards an object's bytes itself
    (uploads are checksummed, stored copies scrubbed); what a HEAD cannot see, an object overwritten with
    other bytes of the same size, only a full check can (:meth:`HiddenStateStore.verify`). Downloading a
    task's whole output to hash it cost every extract (re)start up to a terabyte of traffic and of local
    disk, kept in the cache. ``$EAGLE3_VERIFY=always`` turns both shortcuts off."""
    always = os.environ.get(VERIFY_ENV) == "always"
    marks = VerifiedMarks(uri) if use_marks and not always else None
    by_size = by_size and st.is_s3(uri) and not always
    shards = sorted(entries if names is None else names)

    def check(shard: str) -> tuple[str | None, str | None, str | None]:
        """(what is wrong or None, the local file hashed, its sha256)."""
        f, entry = st.join(uri, shard), entries[shard]
        if by_size and entry.get("bytes") is not None:
            size = st.file_size(f)
            if size is None:
                return "missing (listed in an index)", None, None
            wrong = None if size == entry["bytes"] else f"{size} bytes, not the {entry['bytes']} of the index"
            return wrong, None, None
        if not st.exists(f):
            return "missing (listed in an index)", None, None
        path = st.local_path(f)
        if marks is not None and marks.holds(shard, path, entry["sha256"]):
            return None, None, None
        digest = st.sha256_file(path)
        return st.sha256_problem(path, entry["sha256"], "the index", digest=digest), path, digest

    bad = {}
    # HEADs wait on the network, hashing on the disk and a core per file
    threads = 16 if by_size else min(4, os.cpu_count() or 1)
    for shard, (problem, path, digest) in zip(shards, _in_threads(check, shards, threads, uri)):
        if problem:
            bad[shard] = problem
        elif digest is not None and marks is not None:
            marks.add(shard, path, digest)
    if marks is not None:
        marks.save()
    return bad


def _in_threads(fn, items: list, threads: int, what: str = "") -> list:
    """``fn`` of each item, in order, a few at a time (hashlib and boto3 release the GIL), logging how far it is
    with an ETA every PROGRESS_EVERY_S (a store's first check hashes it all: minutes per terabyte)."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    from concurrent.futures import ThreadPoolExecutor

    from eagle3.progress import fmt_duration

    out, t0 = [], time.monotonic()
    last = t0
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        for result in pool.map(fn, items):
            out.append(result)
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S and len(out) < len(items):
                last = now
                log.info("%s: %d/%d shards checked, elapsed %s, ETA %s", what, len(out), len(items),
                         fmt_duration(now - t0), fmt_duration((len(items) - len(out)) * (now - t0) / len(out)))
    return out


def _hash_files(paths: list[str]) -> list[str]:
    """sha256 of each file, a few at a time (hashlib releases the GIL, so threads overlap reads and hashing)."""
    return _in_threads(st.sha256_file, paths, min(4, os.cpu_count() or 1), "sha256")


class VerifiedMarks:
    """Which shards of a store this machine verified, keyed by the local file's size, mtime and inode.

    A shard rewritten, truncated or replaced since changes one of them and is hashed again; silent bit rot
    keeps them, so ``$EAGLE3_VERIFY=always`` (or :meth:`HiddenStateStore.verify` without marks) re-hashes
    everything. Kept in the local cache (eagle3.storage.cache_dir), never in the store: readers do not
    write to a shared artifact.
    """

    def __init__(self, store_uri: str):
        import hashlib

        key = hashlib.sha256(os.path.abspath(store_uri).encode() if not st.is_s3(store_uri)
                             else store_uri.encode()).hexdigest()[:24]
        self.path = st.cache_dir() / "verified" / f"{key}.json"
        try:
            self.marks = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.marks = {}
        self._changed = False

    @staticmethod
    def _stamp(path: str) -> list:
        s = os.stat(path)
        return [s.st_size, s.st_mtime_ns, s.st_ino]

    def holds(self, shard: str, path: str, sha256: str) -> bool:
        m = self.marks.get(shard)
        return bool(m) and m["sha256"] == sha256 and m["stamp"] == self._stamp(path)

    def add(self, shard: str, path: str, sha256: str) -> None:
        self.marks[shard] = {"sha256": sha256, "stamp": self._stamp(path)}
        self._changed = True

    def save(self) -> None:
        if self._changed:
            with contextlib.suppress(OSError):  # a read-only cache only costs a re-hash next time
                st.write_json(self.path, self.marks)
