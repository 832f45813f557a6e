"""A Gemma 3 target on the project's code paths (tiny random Gemma 3, fp32 CPU): the decoder's KV cache
across the sliding window, the draft config and init where they read Gemma tensors, and extraction's
capture through the transformers forward."""

from __future__ import annotations

import math

import torch

from eagle3.evaluate.spec_decode import Eagle3DraftStepper, TargetRunner, greedy_generate, speculative_generate
from tests.evaluate.test_spec_decode import OracleDraft as LlamaOracleDraft
from tests.gemma3.conftest import SLIDING_WINDOW, tiny_gemma3

PROMPT = [2, 17, 301, 44, 9]
NEW = 5 * SLIDING_WINDOW  # the decode crosses the window several times


class OracleDraft(LlamaOracleDraft):
    """The SmolLM2-vocab oracle with its wrong proposals kept inside the tiny Gemma's 512 ids."""

    def _propose(self, depth):
        token, hidden = super()._propose(depth)
        return token % 512, hidden


def _vocab_map(v: int, vd: int):
    d2t = torch.zeros(vd, dtype=torch.long)  # draft id i -> target id i
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[:vd] = True
    return d2t, t2d


def _full_recompute(model, prompt, n):
    """The oracle: greedy decoding with no cache, the whole sequence re-run for every token."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_decoder_cache_is_lossless_across_the_sliding_window(tiny_gemma3_dir):
    from eagle3.draft.build import build_draft
    from eagle3.draft.config import DraftConfig

    model = tiny_gemma3()
    runner = TargetRunner(model, aux_layers=[1, 2, 3])
    base = greedy_generate(runner, PROMPT, NEW, frozenset())
    assert base.tokens == _full_recompute(model, PROMPT, NEW)
    # Rejected drafts roll the cache back after the window is full (transformers' sliding layer refuses
    # that unless it records the past); every pattern of acceptance must give the baseline's tokens.
    for correct, steps in ((0, 3), (1, 3), (2, 3), (3, 3)):
        spec = speculative_generate(runner, OracleDraft(PROMPT + base.tokens, correct), PROMPT, NEW, frozenset(),
                                    steps=steps)
        assert spec.tokens == base.tokens, (correct, steps)
    cfg = DraftConfig.from_target_dir(tiny_gemma3_dir, draft_vocab_size=128, aux_layers=[1, 2, 3])
    draft = build_draft(cfg, tiny_gemma3_dir, *_vocab_map(512, 128), init="target", seed=1)
    spec = speculative_generate(runner, Eagle3DraftStepper(draft), PROMPT, NEW, frozenset(), steps=3)
    assert spec.tokens == base.tokens
    # The sliding layers hold no more than the window after each round (the past is not kept forever).
    cache = runner.new_cache()
    runner.forward(PROMPT * 4, cache, all_logits=True, aux=False)
    from eagle3.evaluate.spec_decode import crop_cache

    crop_cache(cache, len(PROMPT) * 4 - 2)
    assert cache.layers[0].keys.shape[2] == SLIDING_WINDOW - 1 and cache.layers[5].keys.shape[2] == 18


def test_draft_config_and_init_follow_gemma_conventions(tiny_gemma3_dir):
    from eagle3.draft.build import build_draft
    from eagle3.draft.config import DraftConfig
    from eagle3.export import draft_config_json

    cfg = DraftConfig.from_target_dir(tiny_gemma3_dir, draft_vocab_size=128)
    assert cfg.hidden_act == "silu" and cfg.extra["target_hidden_act"] == "gelu_pytorch_tanh"
    assert cfg.rope_theta == 1_000_000.0 and cfg.rope_scaling is None  # the full-attention layers' rope
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.aux_layers) == (16, 1, (1, 2, 2))
    exported = draft_config_json(cfg, "bfloat16")
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"] and exported["hidden_act"] == "silu"

    model = tiny_gemma3()
    d2t, t2d = _vocab_map(512, 128)
    draft = build_draft(cfg, tiny_gemma3_dir, d2t, t2d, init="target", seed=1)
    last = model.model.layers[-1]
    # Gemma's RMSNorm scales by 1 + w; the draft's (Llama's) by w.
    torch.testing.assert_close(draft.midlayer.post_attention_layernorm.weight,
                               1 + last.pre_feedforward_layernorm.weight)
    torch.testing.assert_close(draft.midlayer.input_layernorm.weight, 1 + last.input_layernorm.weight)
    # The oracle: the draft's norm + lm_head reproduce Gemma's final norm + tied head on the draft vocab.
    h = torch.randn(3, 7, 64) * 20
    with torch.no_grad():
        want = model.lm_head(model.model.norm(h))[..., :128]
        torch.testing.assert_close(draft.compute_logits(h), want, rtol=1e-4, atol=1e-4)
        # Gemma's embedding lookup is scaled by sqrt(H); the draft reads the stored weight, which
        # input_layernorm makes the same thing up to its eps (0.25% for these N(0, 0.02) rows).
        ids = torch.tensor([[5, 77, 300]])
        scaled = model.model.embed_tokens(ids)
        torch.testing.assert_close(scaled, draft.embed(ids) * math.sqrt(64), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(draft.midlayer.input_layernorm(scaled),
                                   draft.midlayer.input_layernorm(draft.embed(ids)), rtol=1e-2, atol=1e-2)


def test_capture_uses_the_transformers_forward_for_gemma(tiny_gemma3_dir):
    from eagle3.extract.capture import TargetCapture

    cap = TargetCapture(tiny_gemma3_dir, aux_layers=[1, 2, 3], precision="float32")
    assert cap.forward_path.startswith("transformers") and "gemma3" in cap.forward_path
    assert (cap.num_layers, cap.hidden_size, cap.vocab_size) == (6, 64, 512)
    seqs = [PROMPT * 3, PROMPT[:3]]
    aux, last, lengths = cap.forward(seqs)
    assert lengths == [15, 3] and aux.shape == (18, 3 * 64) and last.shape == (18, 64)
    with torch.no_grad():
        ref = cap.model(input_ids=torch.tensor([seqs[0]]), output_hidden_states=True)
    torch.testing.assert_close(aux[:15], torch.cat([ref.hidden_states[i + 1][0] for i in (1, 2, 3)], -1))
    # `last` is the final-normed state: through the (tied) lm_head it gives the target's logits.
    torch.testing.assert_close(cap.lm_head(last[:15]), ref.logits[0], rtol=1e-4, atol=1e-4)
