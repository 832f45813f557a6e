"""Measured extraction speed per engine, kept beside the store for the next run's gate (torch-free).

Each extract task records what its forwards did (tokens, forward seconds) in
``<store root>/rates/extract-<engine>-<model key>-<task>.json``, one file per task so parallel shards never
write the same file; a later run's task replaces its own. The verify gate reads them back (`measured`) and
prices extraction with the engine the run asks for. A task's rate is one device group's (one GPU, or one
vLLM replica over its tensor x pipeline GPUs); shards run side by side, so the gate multiplies by the number
of tasks the last run had.
"""

from __future__ import annotations

import hashlib
import time

from eagle3 import storage

FOLDER = "rates"


def _model_key(model: str) -> str:
    return hashlib.sha256(str(model).encode()).hexdigest()[:12]


def record(store_root: str, engine: str, model: str, task: str, tokens: int, seconds: float) -> None:
    """Keep one extract task's measured forward speed (nothing when it computed nothing)."""
    if tokens <= 0 or seconds <= 0:
        return
    storage.write_json(storage.join(store_root, FOLDER, f"extract-{engine}-{_model_key(model)}-{task}.json"),
                       {"engine": engine, "model": str(model), "task": task, "tokens": int(tokens),
                        "seconds": round(float(seconds), 3), "tokens_per_s": round(tokens / seconds, 1),
                        "recorded_at": time.time()})


def measured(store_root: str | None, model: str | None) -> dict[str, dict]:
    """{engine: {"tokens_per_s" (per task), "tasks", "tokens", "seconds"}} from the runs before, for ``model``."""
    if not store_root or not model:
        return {}
    folder = storage.join(store_root, FOLDER)
    out: dict[str, dict] = {}
    for name in storage.list_files(folder):
        if not name.startswith("extract-") or f"-{_model_key(model)}-" not in name:
            continue
        rec = storage.read_json(storage.join(folder, name))
        agg = out.setdefault(rec["engine"], {"tasks": 0, "tokens": 0, "seconds": 0.0})
        agg["tasks"] += 1
        agg["tokens"] += int(rec["tokens"])
        agg["seconds"] += float(rec["seconds"])
    for agg in out.values():
        agg["tokens_per_s"] = round(agg["tokens"] / max(agg["seconds"], 1e-9), 1)
    return out
