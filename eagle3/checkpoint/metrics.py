"""CKPT/metrics.jsonl: one JSON object a line per train/eval event (rank 0 only); its one writer and reader.

Every line has ``event`` ("train" or "eval"), ``step``, ``loss``, ``loss_i`` and ``acc_i`` (one value per
TTT step), ``sim_accept_len`` (1 + Σ_k Π_{j≤k} acc_j) and ``time``; train lines add lr, grad_norm, tokens,
tokens_per_s, token_budget, grad_accum; eval lines heldout_samples and heldout_tokens.

A resumed run first drops the lines of steps after its checkpoint (a killed
run may have logged steps it never saved), so the file always holds exactly
one curve. On S3 the file is kept in the local cache and uploaded at every
checkpoint and at the end (S3 objects cannot be appended to).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from eagle3 import storage

METRICS_FILE = "metrics.jsonl"

log = logging.getLogger(__name__)


def _events(text: str, uri: str) -> list[dict]:
    """The parsed lines of a metrics.jsonl. A line that does not parse (a kill in the middle of a write tears
    the last one) is left out with a warning naming it: the curves are a record, never a reason to stop a
    resume or an evaluation."""
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            log.warning("%s:%d: not a metrics event (%s), left out: a write cut short by a kill", uri, number, e)
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            log.warning("%s:%d: not a metrics event (a JSON %s), left out", uri, number, type(row).__name__)
    return rows


class MetricsLog:
    def __init__(self, out: str, enabled: bool = True, truncate_after: int = 0):
        self.uri = storage.join(str(out), METRICS_FILE)
        self.enabled = enabled
        if storage.is_s3(self.uri):
            key = hashlib.sha256(self.uri.encode()).hexdigest()[:16]
            self.path = storage.cache_dir() / "train-metrics" / key / "metrics.jsonl"
        else:
            self.path = Path(self.uri)
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = storage.read_text(self.uri) if storage.exists(self.uri) else ""
        kept = [row for row in _events(text, self.uri) if row.get("step", 0) <= truncate_after]
        self.path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in kept))
        self.flush()

    def write(self, event: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(event, time=round(time.time(), 3)), sort_keys=True) + "\n")

    def flush(self) -> None:
        if self.enabled and storage.is_s3(self.uri):
            storage.put_file(self.path, self.uri)


def read_metrics(uri: str, event: str | None = None) -> list[dict]:
    """The events of a metrics.jsonl (optionally only ``event`` = "train" or "eval")."""
    rows = _events(storage.read_text(uri), str(uri)) if storage.exists(uri) else []
    return [r for r in rows if event is None or r.get("event") == event]


def last_eval(checkpoint: str) -> dict | None:
    """The last held-out evaluation of CKPT/metrics.jsonl (None when there is none)."""
    evals = read_metrics(storage.join(str(checkpoint), METRICS_FILE), "eval")
    return evals[-1] if evals else None
