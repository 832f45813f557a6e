"""The draft model: config mirroring, decoding vs TTT agreement, cache rollback, checkpoint d2t."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft.config import DraftConfig
from eagle3.draft.model import DraftCache, Eagle3Draft, rope_cos_sin, rope_inv_freq
from eagle3.draft.ttt import positions_in_sample, step0_mask
from eagle3.errors import InputError
from tests.draft.tiny import make_tiny_draft, tiny_config, tiny_vocab_map


def test_config_mirrors_target_transformers5_and_4_layouts():
    v5 = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
          "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "vocab_size": 49152,
          "num_hidden_layers": 30, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    cfg = DraftConfig.from_target(v5, draft_vocab_size=8192)
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.head_dim) == (100000.0, None, 64)
    assert cfg.aux_layers == (1, 14, 26)  # [1, L/2-1, L-4]
    v4 = dict(v5, rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    del v4["rope_parameters"]
    cfg4 = DraftConfig.from_target(v4, draft_vocab_size=100, aux_layers=[2, 3, 4])
    assert cfg4.rope_theta == 500000.0 and cfg4.rope_scaling["rope_type"] == "llama3"
    assert DraftConfig.from_dict(cfg4.to_dict()) == cfg4
    with pytest.raises(InputError, match="draft_vocab_size"):
        DraftConfig.from_target(v5, draft_vocab_size=10**6)
    with pytest.raises(InputError, match="unknown key"):
        DraftConfig.from_dict({**cfg.to_dict(), "bogus": 1})


@pytest.mark.parametrize("scaling", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_rope_matches_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = tiny_config(rope_scaling=scaling, rope_theta=500000.0, max_position_embeddings=512)
    hf = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8, max_position_embeddings=512,
                     rope_parameters={"rope_type": "default", "rope_theta": 500000.0, **(scaling or {})})
    pos = torch.arange(0, 300, 7)[None]
    cos, sin = rope_cos_sin(rope_inv_freq(cfg), pos)
    hf_cos, hf_sin = LlamaRotaryEmbedding(hf)(torch.zeros(1, 1, 8), pos)
    torch.testing.assert_close(cos[:, 0], hf_cos, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin[:, 0], hf_sin, rtol=1e-5, atol=1e-5)


def _ttt_chain(model, ids, aux, steps):
    """TTT forward (no loss) over one row: logits of each step [steps, T, Vd]."""
    seg = torch.ones_like(ids)
    pos, mask0 = positions_in_sample(seg), step0_mask(seg)
    hidden, history, out = model.project_aux(aux), [], []
    for i in range(steps):
        shifted = torch.cat([ids[:, 1 + i:], torch.zeros_like(ids[:, :1 + i])], dim=1)
        logits, hidden = model.ttt_step(shifted, hidden, pos + i, history, mask0)
        out.append(logits[0])
    return torch.stack(out)


def test_decoding_with_cache_reproduces_every_ttt_step(tiny_draft):
    """Decoding (prefix cache + own chain) sees exactly what TTT step i trains on."""
    torch.manual_seed(0)
    t, steps = 10, 4
    ids = torch.randint(0, 50, (1, t + steps))
    aux = torch.randn(1, t + steps, 96)
    with torch.no_grad():
        ttt = _ttt_chain(tiny_draft, ids, aux, steps)
        for pos in (0, 3, t - 1):
            cache = DraftCache()
            # Prefill: row j reads (x_{j+1}, aux_j) at position j, for j <= pos.
            logits, hidden = tiny_draft.step(ids[:, 1:pos + 2], aux[:, :pos + 1], torch.arange(pos + 1)[None], cache)
            torch.testing.assert_close(logits[0], ttt[0, :pos + 1], rtol=1e-4, atol=1e-5)
            hidden = hidden[:, -1:]
            for i in range(1, steps):
                logits, hidden = tiny_draft.step(ids[:, pos + 1 + i:pos + 2 + i], hidden,
                                                 torch.tensor([[pos + i]]), cache)
                torch.testing.assert_close(logits[0, 0], ttt[i, pos], rtol=1e-4, atol=1e-5)
            assert len(cache) == pos + steps


def test_cache_truncate_rolls_back_rejected_tokens(tiny_draft):
    torch.manual_seed(1)
    ids, aux = torch.randint(0, 50, (1, 8)), torch.randn(1, 8, 96)
    with torch.no_grad():
        fresh = DraftCache()
        want, _ = tiny_draft.step(ids, aux, torch.arange(8)[None], fresh)
        cache = DraftCache()
        tiny_draft.step(ids[:, :5], aux[:, :5], torch.arange(5)[None], cache)
        tiny_draft.step(ids[:, :3], torch.randn(1, 3, 32), torch.arange(5, 8)[None], cache)  # rejected chain
        cache.truncate(5)
        got, _ = tiny_draft.step(ids[:, 5:], aux[:, 5:], torch.arange(5, 8)[None], cache)
    torch.testing.assert_close(got, want[:, 5:], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        cache.truncate(99)


def test_checkpoint_keeps_its_own_d2t(tiny_draft):
    """Fine-tuning from a checkpoint must not re-derive d2t from a new vocab build."""
    state = {k: v.clone() for k, v in tiny_draft.state_dict().items()}
    assert "embed_weight" not in state and {"d2t", "t2d", "fc.weight", "lm_head.weight"} <= set(state)
    other_d2t, other_t2d = tiny_vocab_map(seed=7)
    assert not torch.equal(other_d2t, state["d2t"])
    reloaded = Eagle3Draft.from_state_dict(tiny_draft.config, state, tiny_draft.embed_weight)
    assert torch.equal(reloaded.d2t, tiny_draft.d2t) and torch.equal(reloaded.t2d, tiny_draft.t2d)
    # Even a model built under another map takes the checkpoint's on load.
    fresh = Eagle3Draft(tiny_draft.config, tiny_draft.embed_weight, other_d2t, other_t2d)
    fresh.load_state_dict_strict(state)
    assert torch.equal(fresh.d2t, tiny_draft.d2t)
    with pytest.raises(InputError, match="d2t"):
        Eagle3Draft.from_state_dict(tiny_draft.config, {k: v for k, v in state.items() if k != "d2t"},
                                    tiny_draft.embed_weight)
    with pytest.raises(InputError, match="unexpected"):
        fresh.load_state_dict_strict({**state, "embed_tokens.weight": tiny_draft.embed_weight})


def test_shape_mismatches_are_input_errors():
    cfg = tiny_config()
    d2t, t2d = tiny_vocab_map()
    with pytest.raises(InputError, match="embedding"):
        Eagle3Draft(cfg, torch.zeros(49, 32), d2t, t2d)
    with pytest.raises(InputError, match="draft-vocab-size"):
        Eagle3Draft(cfg, torch.zeros(50, 32), d2t[:5], t2d)


def test_trainable_parameters_exclude_the_frozen_embedding():
    model = make_tiny_draft()
    names = {n for n, _ in model.named_parameters()}
    assert not any("embed" in n for n in names)
    assert names == {n for n in model.state_dict() if n not in ("d2t", "t2d")}
