"""A checkpoint folder for export tests, written by the trainer's own writer (eagle3.checkpoint)."""

from __future__ import annotations

from pathlib import Path


def write_checkpoint(root: Path, model, step: int = 5, extra: dict | None = None, drop: tuple = ()) -> Path:
    """CKPT/step-<n>/ + CKPT/latest.json holding ``model``'s fp32 weights (and ``extra`` tensors, less ``drop``)."""
    from eagle3 import checkpoint

    tensors = {k: v.detach().float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    tensors.update(extra or {})
    tensors = {k: v for k, v in tensors.items() if k not in drop}
    return Path(checkpoint.save(str(root), step, tensors, {}, {}, model.config.to_dict(), keep=100))
