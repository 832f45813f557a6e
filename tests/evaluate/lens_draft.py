"""A draft built, not trained, whose acceptance depends on which target layers feed it.

Start from init="target" (fc = identity on the deepest aux block, norm and lm_head = the target's),
then zero the midlayer's attention and MLP outputs, so the draft's first guess is the target's
final norm and lm_head applied to the output of the deepest aux layer: a "logit lens" there. Read
late enough, that is the target's own next token most of the time; read one layer too early (the
old export read by vLLM) it is clearly worse. Full vocabulary, so the export carries no d2t (what
vLLM needs for a full-vocab draft).
"""

from __future__ import annotations

import json
from pathlib import Path


def lens_draft(target_dir: str, out: Path, aux: tuple[int, int, int], config_aux=None) -> str:
    """Write DRAFT to ``out``; ``config_aux`` (default ``aux``) is what its config.json claims it was trained on."""
    import torch
    from safetensors.torch import save_file

    from eagle3.draft.build import build_draft
    from eagle3.draft.config import DraftConfig
    from eagle3.export import draft_config_json, export_tensors
    from eagle3.target import vocab_size

    v = vocab_size(target_dir)
    cfg = DraftConfig.from_target_dir(target_dir, draft_vocab_size=v, aux_layer_ids=list(aux))
    draft = build_draft(cfg, target_dir, torch.zeros(v, dtype=torch.long), torch.ones(v, dtype=torch.bool),
                        init="target", seed=1)
    with torch.no_grad():
        draft.midlayer.self_attn.o_proj.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
    out.mkdir(parents=True, exist_ok=True)
    save_file(export_tensors(draft.state_dict(), "float32", "lens draft"), str(out / "model.safetensors"))
    claimed = DraftConfig.from_target_dir(target_dir, draft_vocab_size=v, aux_layer_ids=list(config_aux or aux))
    (out / "config.json").write_text(json.dumps(draft_config_json(claimed, "float32")))
    return str(out)
