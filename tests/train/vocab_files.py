"""Vocab folders for training tests, written as the vocab stage writes them (map + vocab.json with its checksum)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch


def write_vocab(folder, target_ids, vocab_size: int) -> str:
    """VOCAB/ whose draft tokens are ``target_ids`` (distinct) of a target with ``vocab_size`` lm_head rows."""
    from safetensors.torch import save

    ids = torch.as_tensor(sorted(target_ids), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    blob = save({"d2t": ids - torch.arange(len(ids)), "t2d": t2d})
    (folder / "vocab.safetensors").write_bytes(blob)
    (folder / "vocab.json").write_text(json.dumps({
        "draft_vocab_size": len(ids), "vocab_size": vocab_size,
        "checksums": {"vocab.safetensors": hashlib.sha256(blob).hexdigest()}}))
    return str(folder)
