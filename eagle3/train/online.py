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
``online<rank>``, written atomically like extraction's), and are read from it afterwards:
the first epoch pays the target forward, later epochs and later runs do not.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from eagle3 import storage as st
from eagle3.errors import InputError
from eagle3.extract import codec

log = logging.getLogger(__name__)

SHARD_TOKENS = 1 << 20
"""Tokens buffered before a write-back shard is published (the end of training flushes the rest)."""


class OnlineSource:
    """The samples of a merged dataset, served from the store where present and from the target otherwise."""

    def __init__(self, capture, storage: str, samples: dict, tokens, store_root: str, stored=None,
                 writer=None, model_name: str | None = None, model_fp: str | None = None):
        self.capture, self.storage = capture, storage
        self._samples, self._tokens = samples, tokens  # {id: eagle3.extract.plan.Sample}, MergedTokens
        self.store_root, self.stored, self.writer = store_root, stored, writer
        self.layers, self.hidden_size = list(capture.layers), capture.hidden_size
        self.uri = f"online:{model_name} (store {store_root})"
        self.info = {"model_name": model_name, "model_fingerprint": model_fp, "vocab_size": capture.vocab_size,
                     "layers": self.layers, "hidden_size": self.hidden_size, "storage": storage}
        self._pending: list[dict] = []
        self._pending_tokens = 0
        self.counts = {"samples_from_store": 0, "samples_computed": 0, "tokens_computed": 0,
                       "samples_written_back": 0, "target_seconds": 0.0}

    # -- what the trainer reads (HiddenStateStore's interface) ---------------------
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
    def _compute(self, ids: list[str]) -> dict[str, dict]:
        t0 = time.monotonic()
        rows = [self._tokens.row(self._sample(sid).row) for sid in ids]
        aux, last, lengths = self.capture.forward([r[0] for r in rows])
        feats = codec.encode(self.storage, aux, last, lm_head=self.capture.lm_head)
        out, pos = {}, 0
        for sid, (input_ids, loss_mask), n in zip(ids, rows, lengths):
            stored = {k: v[pos:pos + n] for k, v in feats.items()}
            pos += n
            sample = codec.decode(self.storage, stored)
            sample.update(input_ids=torch.from_numpy(input_ids), loss_mask=torch.from_numpy(loss_mask))
            out[sid] = sample
            if self.writer is not None:
                self._pending.append({"id": sid, "input_ids": sample["input_ids"], "loss_mask": sample["loss_mask"],
                                      "tensors": stored})
                self._pending_tokens += n
        self.counts["samples_computed"] += len(ids)
        self.counts["tokens_computed"] += pos
        self.counts["target_seconds"] += time.monotonic() - t0
        if self._pending_tokens >= SHARD_TOKENS:
            self.flush()
        return out

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
                "forward": self.capture.forward_path}

    def _sample(self, sample_id: str):
        try:
            return self._samples[sample_id]
        except KeyError:
            raise KeyError(f"sample {sample_id!r} is not in the merged dataset") from None


def _store_root(uri: str) -> str:
    """The root that holds store key folders, given a root or a key folder itself."""
    if st.exists(st.join(uri, "store.json")):
        return uri.rstrip("/").rsplit("/", 1)[0]
    return uri


def open_source(cfg, device: str) -> OnlineSource:
    """The OnlineSource of a TrainConfig with ``online``: the target on ``device`` and what the store holds."""
    from eagle3.extract.capture import TargetCapture
    from eagle3.extract.stage import read_merged
    from eagle3.extract.store import HiddenStateStore, StoreWriter, store_key
    from eagle3.target import model_fingerprint, resolve_model

    samples, tokens = read_merged(cfg.merged)
    if not samples:
        raise InputError(f"the merged dataset {cfg.merged} holds no samples; nothing to train on")
    capture = TargetCapture(cfg.model, device, list(cfg.layers) if cfg.layers else None, precision=cfg.precision)
    capture.model.eval()
    model_fp = model_fingerprint(resolve_model(cfg.model))
    root = _store_root(cfg.store)
    key = store_key(model_fp, capture.layers, cfg.storage)
    stored = HiddenStateStore(st.join(root, key)) if st.exists(st.join(root, key, "store.json")) else None
    writer = None
    if cfg.write_back:
        rank = os.environ.get("RANK", "0")
        writer = StoreWriter(root, model_fp=model_fp, model_name=cfg.model, layers=capture.layers,
                             hidden_size=capture.hidden_size, vocab_size=capture.vocab_size, storage=cfg.storage,
                             task=f"online{rank}", precision=capture.precision.to_dict()).open()
    source = OnlineSource(capture, cfg.storage, {s.id: s for s in samples}, tokens, root, stored, writer,
                          model_name=cfg.model, model_fp=model_fp)
    have = sum(1 for s in samples if stored is not None and s.id in stored)
    log.info("online training: %d samples, %d already in the store %s, %d computed by the target (%s forward on "
             "%s, %s)%s", len(samples), have, st.join(root, key), len(samples) - have, capture.forward_path, device,
             capture.precision.name, "; computed samples are written back" if writer else "")
    return source
