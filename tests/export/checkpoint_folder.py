"""Write a checkpoint folder in the CONTRACTS.md format, without the trainer."""

from __future__ import annotations

import json
from pathlib import Path


def write_checkpoint(root: Path, model, step: int = 5, extra: dict | None = None) -> Path:
    """CKPT/step-<n>/{model.safetensors, config.json, train_state.json} + CKPT/latest.json."""
    from safetensors.torch import save_file

    name = f"step-{step:08d}"
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    tensors.update(extra or {})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(model.config.to_dict()))
    (folder / "train_state.json").write_text(json.dumps({"step": step}))
    (root / "latest.json").write_text(json.dumps({"step": step, "dir": name}))
    return folder
