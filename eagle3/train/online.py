"""Online training: the target runs inside the training process, so no full store is needed.

:class:`OnlineSource` stands in for :class:`eagle3.extract.store.HiddenStateStore` in the
trainer: ``get_many(ids)`` returns per-sample tensors in the reader's format. A sample the
store already holds (same store key, found by its content-hash id) is read from the store;
the others are computed in one target forward per micro-batch by the extraction code
(:class:`eagle3.extract.capture.TargetCapture`, on the training device, no grad) and sent
through ``codec.encode`` then ``codec.decode`` of the chosen storage option. So the draft
trains on exactly what the store would have held, and an online run follows the offline
run's loss curve (tests/train/test_online.py).

With ``write_back`` the computed samples also go into the store (shards of task
``online<rank>``, written atomically like extraction's, recording the engine), and are read from
it afterwards: the first epoch pays the target forward, later epochs and later runs do not.

With ``target_engine`` vllm or sglang the target is a server (the extract stage's served engine,
:mod:`eagle3.extract.served`: vLLM in extraction mode, or SGLang serving the target of a capture draft;
disaggregated: its own process and devices), and
a background thread computes the micro-batches the trainer has scheduled (``prefetch`` ahead), so
the trainer waits only when the server is slower than training. The in-process transformers
target is not prefetched: it would compete with training for the same device.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import torch

from eagle3 import storage as st
from eagle3.errors import InputError
from eagle3.extract import codec

log = logging.getLogger(__name__)

SHARD_TOKENS = 1 << 20
"""Tokens buffered before a write-back shard is published (the end of training flushes the rest)."""


class OnlineSource:
    """The samples of a merged dataset, served from the store where present and from the target otherwise
    (an `eagle3.train.source.SampleSource`)."""

    mode = "online"

    def __init__(self, capture, storage_option: str, samples: dict, tokens, store_root: str | None, stored=None,
                 writer=None, model_name: str | None = None, model_fp: str | None = None,
                 engine: dict | None = None, prefetch: int = 0):
        self.capture, self.storage_option, self.engine = capture, storage_option, engine
        self._prefetch = _Prefetcher(self._forward, prefetch) if prefetch else None
        self._samples, self._tokens = samples, tokens  # {id: eagle3.extract.plan.Sample}, MergedTokens
        self.store_root, self.stored, self.writer = store_root, stored, writer
        self.aux_layers, self.hidden_size = list(capture.aux_layers), capture.hidden_size
        self.uri = f"online:{model_name} (store {store_root or 'none'})"
        self.info = {"model_name": model_name, "model_fingerprint": model_fp, "vocab_size": capture.vocab_size,
                     "aux_layers": self.aux_layers, "hidden_size": self.hidden_size,
                     "storage_option": storage_option}
        self._pending: list[dict] = []
        self._pending_tokens = 0
        self.counts = {"samples_from_store": 0, "samples_computed": 0, "tokens_computed": 0,
                       "samples_written_back": 0, "target_seconds": 0.0,
                       "wait_seconds": 0.0, "prefetched_batches": 0}

    # -- what the trainer reads (SampleSource) ------------------------------------
    def __len__(self) -> int:
        return len(self._samples)

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self._samples

    def sample_ids(self) -> list[str]:
        return list(self._samples)

    def num_tokens(self, sample_id: str) -> int:
        return int(self._sample(sample_id).num_tokens)

    def check(self, sample_ids=None) -> None:
        """Verify the stored shards this run will read (hybrid); computed samples have nothing to check."""
        if self.stored is not None:
            ids = [s for s in (self._samples if sample_ids is None else sample_ids) if s in self.stored]
            if ids:
                self.stored.check(ids)

    def loss_mask(self, sample_id: str) -> torch.Tensor:
        return torch.from_numpy(self._tokens.row(self._sample(sample_id).row)[1])

    def get(self, sample_id: str) -> dict:
        return self.get_many([sample_id])[0]

    def get_many(self, ids: list[str]) -> list[dict]:
        """Per-sample tensors, in order, as HiddenStateStore.get returns them; one target forward for all
        samples the store lacks."""
        out: dict[str, dict] = {}
        missing = []
        for sid in ids:
            if self.stored is not None and sid in self.stored:
                out[sid] = self.stored.get(sid)
                self.counts["samples_from_store"] += 1
            else:
                missing.append(sid)
        if missing:
            out.update(self._compute(missing))
        return [out[sid] for sid in ids]

    # -- the target ---------------------------------------------------------------
    def schedule(self, batches: list[list[str]]) -> None:
        """Micro-batches the trainer will ask for next, in order: computed ahead when prefetching."""
        if self._prefetch is not None:
            self._prefetch.schedule([self._missing(b) for b in batches])

    def _missing(self, ids: list[str]) -> tuple[str, ...]:
        return tuple(s for s in ids if self.stored is None or s not in self.stored)

    def _forward(self, ids: list[str]):
        """The target's states of ``ids`` as stored (codec.encode), per sample; no bookkeeping (it may run in
        the prefetch thread)."""
        t0 = time.monotonic()
        rows = [self._tokens.row(self._sample(sid).row) for sid in ids]
        seqs = [r[0] for r in rows]
        aux, last, lengths = self.capture.forward(seqs, sample_ids=ids)
        feats = codec.encode(self.storage_option, aux, last, lm_head=self.capture.lm_head)
        out, pos = [], 0
        for n in lengths:
            out.append({k: v[pos:pos + n] for k, v in feats.items()})
            pos += n
        return rows, out, time.monotonic() - t0

    def _compute(self, ids: list[str]) -> dict[str, dict]:
        t0 = time.monotonic()
        done = self._prefetch.take(tuple(ids)) if self._prefetch is not None else None
        if done is not None:
            self.counts["prefetched_batches"] += 1
        rows, feats, seconds = done if done is not None else self._forward(ids)
        self.counts["wait_seconds"] += time.monotonic() - t0
        out, pos = {}, 0
        for sid, (input_ids, loss_mask), stored in zip(ids, rows, feats):
            n = len(input_ids)
            pos += n
            sample = codec.decode(self.storage_option, stored)
            sample.update(input_ids=torch.from_numpy(input_ids), loss_mask=torch.from_numpy(loss_mask))
            out[sid] = sample
            if self.writer is not None:
                self._pending.append({"id": sid, "input_ids": sample["input_ids"], "loss_mask": sample["loss_mask"],
                                      "tensors": stored})
                self._pending_tokens += n
        self.counts["samples_computed"] += len(ids)
        self.counts["tokens_computed"] += pos
        self.counts["target_seconds"] += seconds
        if self._pending_tokens >= SHARD_TOKENS:
            self.flush()
        return out

    def close(self) -> None:
        """Stop the prefetch thread and the target's server (if it has one); safe to call twice."""
        if self._prefetch is not None:
            self._prefetch.close()
        close = getattr(self.capture, "close", None)
        if close is not None:
            close()

    def flush(self) -> None:
        """Publish the buffered computed samples as one shard and read them from the store from now on."""
        if self.writer is None or not self._pending:
            return
        from eagle3.extract.store import HiddenStateStore

        fresh = [s for s in self._pending if self.stored is None or s["id"] not in self.stored]
        unique = list({s["id"]: s for s in fresh}.values())
        if unique:
            self.writer.write_shard(unique)
            self.counts["samples_written_back"] += len(unique)
        self._pending, self._pending_tokens = [], 0
        self.stored = HiddenStateStore(self.writer.uri)

    def stats(self) -> dict:
        return {**self.counts, "target_seconds": round(self.counts["target_seconds"], 3),
                "wait_seconds": round(self.counts["wait_seconds"], 3), "forward": self.capture.forward_path,
                "server_start_s": getattr(self.capture, "start_s", None),  # part of the first wait
                "engine": (self.engine or {}).get("name")}

    def engines(self, sample_ids: list[str]) -> dict[str, int]:
        stored = [s for s in sample_ids if self.stored is not None and s in self.stored]
        out = self.stored.engines(stored) if stored else {}
        held = set(stored)
        computed = [s for s in sample_ids if s not in held]
        if computed:
            name = (self.engine or {}).get("name")
            out[name] = out.get(name, 0) + sum(self.num_tokens(s) for s in computed)
        return out

    def _sample(self, sample_id: str):
        try:
            return self._samples[sample_id]
        except KeyError:
            raise KeyError(f"sample {sample_id!r} is not in the merged dataset") from None


class _Prefetcher:
    """One background thread computing scheduled micro-batches in order, at most ``depth`` ahead of ``take``.

    A batch asked for that is not the next ones scheduled (the schedule went stale, e.g. a write-back made
    some samples stored) drops everything scheduled: the caller computes it itself."""

    def __init__(self, compute, depth: int):
        self._compute, self.depth = compute, int(depth)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eagle3-online-prefetch")
        self._queued: list[tuple[str, ...]] = []
        self._futures: OrderedDict = OrderedDict()  # submitted, not taken yet, in schedule order
        self._lock = threading.Lock()

    def schedule(self, keys: list[tuple[str, ...]]) -> None:
        with self._lock:
            for key in keys:
                if key and key not in self._futures and key not in self._queued:
                    self._queued.append(key)
            self._top_up()

    def take(self, key: tuple[str, ...]):
        """The result for ``key`` (waiting for it), or None when it was not scheduled."""
        with self._lock:
            if key not in self._futures and key not in self._queued:
                self._drop()
                return None
            while key not in self._futures:  # queued behind others: those are stale now
                self._top_up()
                first = next(iter(self._futures))
                if first != key:
                    self._futures.pop(first).cancel()
            while next(iter(self._futures)) != key:
                self._futures.popitem(last=False)[1].cancel()
            future = self._futures.pop(key)
        result = future.result()  # the target's own error, raised in the trainer's thread
        with self._lock:
            self._top_up()
        return result

    def _top_up(self) -> None:
        while self._queued and len(self._futures) < max(self.depth, 1):
            key = self._queued.pop(0)
            self._futures[key] = self._pool.submit(self._compute, list(key))

    def _drop(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        self._queued.clear()

    def close(self) -> None:
        with self._lock:
            self._drop()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _store_root(uri: str) -> str:
    """The root that holds store key folders, given a root or a key folder itself."""
    from eagle3.extract.store_format import is_store

    if is_store(uri):
        return uri.rstrip("/").rsplit("/", 1)[0]
    return uri


def open_source(cfg, device: str) -> OnlineSource:
    """The OnlineSource of a TrainConfig with ``online``: the target (in this process on ``device``, or a vLLM
    or SGLang server the source starts on first use and stops on ``close``) and what the store holds."""
    from eagle3.extract.stage import read_merged
    from eagle3.extract.store import HiddenStateStore, StoreWriter
    from eagle3.extract.store_format import is_store, store_key
    from eagle3.target import model_fingerprint, resolve_model

    samples, tokens = read_merged(cfg.merged)
    if not samples:
        raise InputError(f"the merged dataset {cfg.merged} holds no samples; nothing to train on")
    capture, engine = _target(cfg, device, max(s.num_tokens for s in samples))
    model_fp = model_fingerprint(resolve_model(cfg.model))
    root = _store_root(cfg.store) if cfg.store else None
    key = store_key(model_fp, capture.aux_layers, cfg.storage_option)
    stored = HiddenStateStore(st.join(root, key)) if root and is_store(st.join(root, key)) else None
    writer = None
    if cfg.write_back:
        rank = os.environ.get("RANK", "0")
        writer = StoreWriter(root, model_fp=model_fp, model_name=cfg.model, aux_layers=capture.aux_layers,
                             hidden_size=capture.hidden_size, vocab_size=capture.vocab_size,
                             storage_option=cfg.storage_option,
                             task=f"online{rank}", precision=capture.precision.to_dict(), engine=engine).open()
    remote = engine["name"] != "transformers"
    source = OnlineSource(capture, cfg.storage_option, {s.id: s for s in samples}, tokens, root, stored, writer,
                          model_name=cfg.model, model_fp=model_fp, engine=engine,
                          prefetch=cfg.prefetch if remote else 0)
    have = sum(1 for s in samples if stored is not None and s.id in stored)
    log.info("online training: %d samples, %d already in the store %s, %d computed by the target (%s forward on "
             "%s, %s)%s", len(samples), have, st.join(root, key) if root else "(none)", len(samples) - have,
             capture.forward_path, "its own server" if remote else device, capture.precision.name,
             "; computed samples are written back" if writer else "")
    return source


def server_devices(need: int, engine: str) -> dict[str, str]:
    """The environment of the target's server in online training: CUDA_VISIBLE_DEVICES narrowed to ``need``
    visible GPUs after the first, on which the trainer runs (one process: cuda:0). A server inheriting them all
    would share the trainer's GPU (vLLM then refuses to start for the memory the trainer holds, or the trainer
    runs out of it)."""
    from eagle3.devices import visible_devices

    visible = visible_devices()
    if len(visible) < 1 + need:
        raise InputError(f"online training from a {engine} server needs {1 + need} GPUs, 1 for the trainer and "
                         f"{need} for the server (tensor x pipeline x data parallel), and {len(visible)} are "
                         f"visible ({','.join(visible) or 'none'}); in Airflow set EAGLE3_TARGET_SERVER_GPUS="
                         f"{need} so the train task holds them, lower the server's parallel sizes, or train "
                         "offline from an extracted store")
    return {"CUDA_VISIBLE_DEVICES": ",".join(visible[1:1 + need])}


def _target(cfg, device: str, longest: int):
    """(capture, engine record) for ``cfg.target_engine``: TargetCapture in this process, or the extract
    stage's served engine (a vLLM or SGLang server, started on the first forward)."""
    from eagle3.extract.config import SERVED_ENGINES

    if cfg.target_engine in SERVED_ENGINES:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one server per rank would hold the target N times
            raise InputError(f"TrainConfig.target_engine={cfg.target_engine!r} trains in one process (one server); "
                             "with several training processes use target_engine='transformers' or train offline")
        from eagle3.extract.config import ExtractConfig
        from eagle3.extract.served import served_capture

        ecfg = ExtractConfig(merged=cfg.merged, model=cfg.model, out=cfg.store or "online",
                             aux_layers=cfg.aux_layers, storage_option=cfg.storage_option,
                             device="cuda" if device.startswith("cuda") else "cpu",
                             precision=cfg.precision, engine=cfg.target_engine,
                             tensor_parallel_size=cfg.target_tensor_parallel_size)
        capture = served_capture(ecfg, ecfg.device, longest)
        if ecfg.device == "cuda":  # this process trains on cuda:0; the server must not share that GPU
            capture.server_env.update(server_devices(ecfg.gpus(), cfg.target_engine))
        return capture, capture.engine
    from eagle3.extract.capture import TargetCapture
    from eagle3.extract.stage import transformers_engine

    capture = TargetCapture(cfg.model, device, list(cfg.aux_layers) if cfg.aux_layers else None,
                            precision=cfg.precision)
    capture.model.eval()
    return capture, transformers_engine()
