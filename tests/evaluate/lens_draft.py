"""A draft built, not trained, whose acceptance depends on which target layers feed it.

Start from init="target" (norm and lm_head = the target's), make fc the identity on one aux block
(``slot``) and zero the midlayer's attention and MLP outputs: the draft's guess at position t is the
target's final norm and lm_head applied to that aux state of position t, a "logit lens" there.
SmolLM2's lm_head is its embedding, so the lens of the EMBEDDING of token t is token t itself, which
is the right guess for token t+2 whenever the answer repeats with period two ("hello, hello, ...").
Trained on aux id 0 (the output of layer 0) the lens has lost the token (SmolLM2: ~0% right), but an
engine that reads id 0 as the input of layer 0, i.e. the embedding (vLLM with the old export), gets
~50% right: τ tells which layer an engine really feeds the draft. Full vocabulary, so the export
carries no d2t (what vLLM needs for a full-vocab draft).
"""

from __future__ import annotations

import json
from pathlib import Path


def lens_draft(target_dir: str, out: Path, aux: tuple[int, int, int], slot: int = 0, config_aux=None) -> str:
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
        h = cfg.hidden_size
        draft.fc.weight.zero_()
        draft.fc.weight[:, slot * h:(slot + 1) * h].copy_(torch.eye(h))
    out.mkdir(parents=True, exist_ok=True)
    save_file(export_tensors(draft.state_dict(), "float32", "lens draft"), str(out / "model.safetensors"))
    claimed = DraftConfig.from_target_dir(target_dir, draft_vocab_size=v, aux_layer_ids=list(config_aux or aux))
    (out / "config.json").write_text(json.dumps(draft_config_json(claimed, "float32")))
    return str(out)
