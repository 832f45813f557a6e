"""Helpers for evaluate tests: an exported draft for a target, written the way `eagle3 export` writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def export_draft(target_dir: str, out: Path, init: str = "random", vd: int = 4096, aux=None) -> str:
    import torch
    from safetensors.torch import save_file

    from eagle3.draft.build import build_draft
    from eagle3.draft.config import DraftConfig
    from eagle3.export import draft_config_json, export_tensors

    cfg = DraftConfig.from_target_dir(target_dir, draft_vocab_size=vd, aux_layers=aux)
    d2t = torch.zeros(vd, dtype=torch.long)  # draft id i -> target id i: the first Vd ids
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[:vd] = True
    draft = build_draft(cfg, target_dir, d2t, t2d, init=init, seed=1)
    out.mkdir(parents=True, exist_ok=True)
    save_file(export_tensors(draft.state_dict(), "float32", "test"), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(draft_config_json(cfg, "float32")))
    return str(out)


@pytest.fixture(scope="session")
def make_draft():
    """`make_draft(target_dir, out, init="random", vd=4096, aux=None) -> DRAFT dir`."""
    return export_draft


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """The CI box is 2 cores shared by many jobs: one torch thread is ~3x faster there for tiny models."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
