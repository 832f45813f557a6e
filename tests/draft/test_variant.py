"""EAGLE 3.1 (fc_norm + norm_output): the draft's forward equals vLLM 0.32's, TTT trains what decoding runs,
the config survives checkpoints, and the export carries what vLLM reads."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from eagle3.draft.config import DraftConfig
from eagle3.draft.model import DraftCache
from eagle3.errors import InputError
from tests.draft.test_model import _ttt_chain
from tests.draft.tiny import make_tiny_draft, tiny_batch


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def vllm_combine(model, aux):
    """vLLM's combine_hidden_states: fc_norm per aux chunk (3.1), then fc."""
    cfg, w = model.config, {n: p.detach() for n, p in model.named_parameters()}
    x = aux
    if cfg.fc_norm:
        x = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"], cfg.rms_norm_eps) for i, c in enumerate(x.chunk(3, dim=-1))],
                      -1)
    return x @ w["fc.weight"].T


def vllm_pass(model, tokens, hidden, pos, keys, values):
    """One forward of vLLM's draft layer over t new rows (input ids ``tokens``, combined ``hidden`` [t, H], integer
    positions ``pos``), appending their keys/values to ``keys``/``values``: embeds through input_layernorm, hidden
    through hidden_norm, residual = the unnormed hidden, fused add + norm, the final norm returning (normed,
    prenorm). Attention is plain causal SDPA over every row so far (GQA repeated). Returns (logits, normed,
    prenorm), each [t, ...]."""
    cfg, layer = model.config, model.midlayer
    eps = cfg.rms_norm_eps
    w = {n: p.detach() for n, p in model.named_parameters()}
    t, inv = len(tokens), model.inv_freq
    emb = model.embed_weight[torch.as_tensor(tokens)]
    a = torch.cat([_rms(emb, w["midlayer.input_layernorm.weight"], eps),
                   _rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
    residual = hidden
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = (a @ w["midlayer.self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)
    k = (a @ w["midlayer.self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    v = (a @ w["midlayer.self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    ang = torch.as_tensor(pos)[:, None].float() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(z):
        return z * cos + torch.cat([-z[..., hd // 2:], z[..., :hd // 2]], -1) * sin
    keys.append(rope(k)), values.append(v)
    kk, vv = torch.cat(keys, 1).repeat_interleave(nh // nkv, 0), torch.cat(values, 1).repeat_interleave(nh // nkv, 0)
    s = kk.shape[1]
    allowed = torch.arange(s)[None] <= (torch.arange(t)[:, None] + s - t)
    o = F.scaled_dot_product_attention(rope(q), kk, vv, attn_mask=allowed)
    attn = o.transpose(0, 1).reshape(t, nh * hd) @ w["midlayer.self_attn.o_proj.weight"].T
    residual = attn + residual
    m = _rms(residual, w["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (F.silu(m @ w["midlayer.mlp.gate_proj.weight"].T) * (m @ w["midlayer.mlp.up_proj.weight"].T)) \
        @ w["midlayer.mlp.down_proj.weight"].T
    prenorm = mlp + residual
    normed = _rms(prenorm, w["norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed, prenorm


def vllm_reference(model, ids, aux, chain: int):
    """vLLM 0.32's Eagle3LlamaForCausalLM (model_executor/models/llama_eagle3.py), written out from its source
    for one sequence (`vllm_combine`, `vllm_pass`); the next step is fed aux_output = normed if norm_output else
    prenorm. Returns the argmax-ready logits of the prefill's last row, then of each of ``chain`` steps fed its
    own previous token and aux_output."""
    hidden = vllm_combine(model, aux)
    keys, values, tokens, outs = [], [], ids.tolist(), []
    for step in range(chain + 1):
        t = len(tokens) if step == 0 else 1
        pos = torch.arange(len(tokens) - t, len(tokens)) if step else torch.arange(t)
        logits, normed, prenorm = vllm_pass(model, tokens[-t:], hidden, pos, keys, values)
        outs.append(logits[-1])
        hidden = (normed if model.config.norm_output else prenorm)[-1:]
        tokens.append(int(logits[-1].argmax() + model.d2t[logits[-1].argmax()]))
    return torch.stack(outs)


@pytest.mark.parametrize("variant", ["eagle3", "eagle3.1"])
def test_decoding_equals_vllms_forward(variant):
    model = make_tiny_draft(variant=variant).eval()
    torch.manual_seed(3)
    ids, aux = torch.randint(0, 50, (9,)), torch.randn(9, 96)
    want = vllm_reference(model, ids, aux, chain=3)
    with torch.no_grad():
        cache = DraftCache()
        logits, hidden = model.step(ids[None], aux[None], torch.arange(9)[None], cache)
        got = [logits[0, -1]]
        for i in range(3):
            token = got[-1].argmax()
            tid = token + model.d2t[token]
            logits, hidden = model.step(tid.view(1, 1), hidden[:, -1:], torch.tensor([[9 + i]]), cache)
            got.append(logits[0, -1])
    torch.testing.assert_close(torch.stack(got), want, rtol=1e-4, atol=1e-4)


def test_the_two_variants_differ_where_3_1_says():
    """3.1's fc reads each aux block RMS-normed (scaling one block changes nothing; eagle3's fc sees the
    scale), and 3.1 feeds the next step norm(out) where eagle3 feeds out."""
    v31 = make_tiny_draft(variant="eagle3.1")
    v3 = make_tiny_draft(variant="eagle3")
    aux = torch.randn(2, 5, 96)
    scaled = aux.clone()
    scaled[..., 32:64] *= 10
    with torch.no_grad():
        torch.testing.assert_close(v31.project_aux(scaled), v31.project_aux(aux), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(v3.project_aux(scaled), v3.project_aux(aux), atol=1e-3)
        out = torch.randn(1, 3, 32)
        _, next31 = v31.head(out)
        _, next3 = v3.head(out)
        torch.testing.assert_close(next31, v31.norm(out))
        assert torch.equal(next3, out)


def test_ttt_trains_what_3_1_decoding_runs():
    """TTT step i at t equals the cached decode's chain step i (as tests/draft/test_model.py shows for eagle3)."""
    model = make_tiny_draft(variant="eagle3.1")
    torch.manual_seed(0)
    t, steps = 8, 3
    ids, aux = torch.randint(0, 50, (1, t + steps)), torch.randn(1, t + steps, 96)
    with torch.no_grad():
        ttt = _ttt_chain(model, ids, aux, steps)
        pos = 4
        cache = DraftCache()
        logits, hidden = model.step(ids[:, 1:pos + 2], aux[:, :pos + 1], torch.arange(pos + 1)[None], cache)
        hidden = hidden[:, -1:]
        for i in range(1, steps):
            logits, hidden = model.step(ids[:, pos + 1 + i:pos + 2 + i], hidden, torch.tensor([[pos + i]]), cache)
            torch.testing.assert_close(logits[0, 0], ttt[i, pos], rtol=1e-4, atol=1e-5)


def test_variant_is_kept_by_the_config_and_refused_when_unknown():
    model = make_tiny_draft(variant="eagle3.1")
    cfg = model.config
    assert DraftConfig.from_dict(cfg.to_dict()) == cfg and cfg.fc_norm and cfg.norm_output
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(model.state_dict())
    old = {k: v for k, v in make_tiny_draft().config.to_dict().items() if k != "variant"}  # before the field
    assert DraftConfig.from_dict(old).variant == "eagle3"
    with pytest.raises(InputError, match="variant"):
        DraftConfig.from_dict({**cfg.to_dict(), "variant": "eagle4"})


def test_export_of_a_3_1_draft_carries_what_vllm_reads(tmp_path):
    from safetensors import safe_open

    from eagle3.export import ExportConfig, export, load_exported_draft
    from tests.export.checkpoint_folder import write_checkpoint

    model = make_tiny_draft(variant="eagle3.1")
    write_checkpoint(tmp_path / "ckpt", model)
    summary = export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft"), dtype="float32"))
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    # vLLM 0.32 llama_eagle3.py: getattr(config, "fc_norm"), getattr(config, "norm_output"), norm_before_fc
    # (eagle_config or top level), getattr(config, "norm_before_residual")
    assert (cfg["fc_norm"], cfg["norm_output"], cfg["norm_before_fc"], cfg["norm_before_residual"]) == \
        (True, True, False, False)
    assert cfg["draft_variant"] == summary["draft_variant"] == "eagle3.1" and summary["tensors"] == 18
    with safe_open(str(tmp_path / "draft" / "model.safetensors"), "pt") as f:
        assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(f.keys())
    reloaded = load_exported_draft(str(tmp_path / "draft"), model.embed_weight)
    assert reloaded.config.variant == "eagle3.1"
    batch = tiny_batch(model.config, b=1, t=6)
    pos = torch.arange(5)[None]
    with torch.no_grad():
        want = model.step(batch["input_ids"][:, 1:], batch["aux"][:, :-1], pos)
        got = reloaded.step(batch["input_ids"][:, 1:], batch["aux"][:, :-1], pos)
    torch.testing.assert_close(got, want)
    cfg["norm_before_residual"] = True  # a variant this project does not run: refused, not run wrongly
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="unsupported"):
        load_exported_draft(str(tmp_path / "draft"), model.embed_weight)
