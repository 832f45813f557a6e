"""Tiny drafts built without a target directory: fast, seeded, CPU."""

from __future__ import annotations

import torch

from eagle3.draft.config import DraftConfig


def tiny_config(**over) -> DraftConfig:
    base = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256, vocab_size=50,
                draft_vocab_size=20, aux_layers=(1, 3, 4))
    base.update(over)
    return DraftConfig(**base)


def tiny_vocab_map(v: int = 50, vd: int = 20, seed: int = 0):
    """A draft vocab of vd sorted random target ids: d2t [vd] int64, t2d [v] bool."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(v, generator=g)[:vd].sort().values
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(vd), t2d


def make_tiny_draft(seed: int = 0, **over):
    """A seeded Eagle3Draft with random weights (std 0.1 so outputs vary)."""
    from eagle3.draft.model import Eagle3Draft

    cfg = tiny_config(**over)
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    d2t, t2d = tiny_vocab_map(cfg.vocab_size, cfg.draft_vocab_size, seed)
    model = Eagle3Draft(cfg, embed, d2t, t2d)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = p.dim() == 1  # RMSNorm weights (3.1's fc_norm.{i} too)
            p.copy_(torch.randn(p.shape, generator=g) * (0.05 if norm else 0.1) + (1.0 if norm else 0.0))
    return model


def tiny_batch(cfg: DraftConfig, b: int = 2, t: int = 12, seed: int = 1):
    """Random unshifted per-position tensors as the store would give them."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        input_ids=torch.randint(0, cfg.vocab_size, (b, t), generator=g),
        aux=torch.randn(b, t, 3 * cfg.hidden_size, generator=g),
        target_logits_draft=torch.randn(b, t, cfg.draft_vocab_size, generator=g) * 3,
        target_argmax_in_draft=torch.ones(b, t, dtype=torch.bool),
        loss_mask=torch.ones(b, t, dtype=torch.uint8),
    )
