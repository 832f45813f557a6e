"""Training checkpoints: the folder layout, atomic save, latest / resolve-step, and the metrics log.

    CKPT/step-<n>/{model,optimizer}.safetensors, train_state.json, config.json
    CKPT/latest.json      {"step": n, "dir": "step-<n>"}, written last
    CKPT/metrics.jsonl    one JSON object a line per train/eval event (METRICS_KEYS)

The trainer writes through this package; export, evaluate, the report and the UI
plugin read through it. No pickle: safetensors and JSON only.
"""

from eagle3.checkpoint.files import (CONFIG_FILE, FILES, LATEST, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE,
                                     Checkpoint, latest_step_dir, list_steps, load_latest, read_step, resolve_step,
                                     save, step_dir_name)
from eagle3.checkpoint.metrics import METRICS_FILE, MetricsLog, last_eval, read_metrics

__all__ = ["CONFIG_FILE", "FILES", "LATEST", "MODEL_FILE", "OPTIMIZER_FILE", "STATE_FILE", "METRICS_FILE",
           "Checkpoint", "MetricsLog", "last_eval", "latest_step_dir", "list_steps", "load_latest", "read_metrics",
           "read_step", "resolve_step", "save", "step_dir_name"]
