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
import time
from pathlib import Path

from eagle3 import storage

METRICS_FILE = "metrics.jsonl"


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
        kept = [line for line in text.splitlines() if line.strip() and json.loads(line).get("step", 0) <= truncate_after]
        self.path.write_text("".join(line + "\n" for line in kept))
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
    lines = storage.read_text(uri).splitlines() if storage.exists(uri) else []
    rows = [json.loads(line) for line in lines if line.strip()]
    return [r for r in rows if event is None or r.get("event") == event]


def last_eval(checkpoint: str) -> dict | None:
    """The last held-out evaluation of CKPT/metrics.jsonl (None when there is none)."""
    evals = read_metrics(storage.join(str(checkpoint), METRICS_FILE), "eval")
    return evals[-1] if evals else None
