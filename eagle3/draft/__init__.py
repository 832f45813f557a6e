"""The EAGLE-3 draft: config, model, training-time test. See docs/draft.md.

Public API (heavy names load torch on first use, so `import eagle3.draft`
stays cheap for the CLI):

    DraftConfig.from_target_dir(model_dir, draft_vocab_size, aux_layers=None)
    build_draft(cfg, target_dir, d2t, t2d, init="target"|"random", seed=0) -> Eagle3Draft
    Eagle3Draft.from_state_dict(cfg, state, embed_weight)     # keeps the state's d2t/t2d
    draft.step(input_ids, hidden, position_ids, cache) -> (logits [B,T,Vd], hidden_out [B,T,H])
    draft.project_aux(aux); DraftCache().truncate(n)
    ttt_forward(draft, input_ids, aux, target_logits_draft, target_argmax_in_draft,
                loss_mask, segment_ids=None, ttt_length=7) -> TTTResult
    target_from_last(last, lm_head_weight, d2t, t2d) -> (target_logits_draft, target_argmax_in_draft)
"""

from __future__ import annotations

import importlib

from eagle3.draft.config import DraftConfig

_LAZY = {
    "Eagle3Draft": "eagle3.draft.model", "DraftCache": "eagle3.draft.model",
    "build_draft": "eagle3.draft.build", "load_target_embedding": "eagle3.draft.build",
    "load_target_head": "eagle3.draft.build", "read_target_tensors": "eagle3.draft.build",
    "ttt_forward": "eagle3.draft.ttt", "target_from_last": "eagle3.draft.ttt", "TTTResult": "eagle3.draft.ttt",
    "sim_accept_len": "eagle3.draft.ttt", "metrics_from_sums": "eagle3.draft.ttt",
    "DEFAULT_TTT_LENGTH": "eagle3.draft.config",
}

__all__ = ["DraftConfig", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eagle3.draft' has no attribute {name!r}")
