"""Building a fresh draft from a target directory (the tiny random Llama)."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft.build import build_draft, load_target_head, read_target_tensors
from eagle3.draft.config import DraftConfig
from eagle3.draft.ttt import target_from_last, ttt_forward
from eagle3.errors import InputError


def _vocab(v=49152, vd=300):
    ids = torch.arange(0, 3 * vd, 3)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(vd), t2d


@pytest.mark.parametrize("init", ["target", "random"])
def test_build_draft_both_inits(tiny_llama_dir, init):
    cfg = DraftConfig.from_target_dir(tiny_llama_dir, draft_vocab_size=300)
    assert cfg.aux_layers == (1, 3, 4) and cfg.num_key_value_heads == 2
    d2t, t2d = _vocab()
    model = build_draft(cfg, tiny_llama_dir, d2t, t2d, init=init, seed=0)
    ref = read_target_tensors(tiny_llama_dir, ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                                               "model.layers.7.mlp.down_proj.weight",
                                               "model.layers.7.self_attn.q_proj.weight"])
    assert torch.equal(model.embed_weight, ref["model.embed_tokens.weight"])
    copied = torch.equal(model.lm_head.weight, ref["lm_head.weight"][torch.arange(300) + d2t])
    assert copied == (init == "target")
    assert torch.equal(model.midlayer.mlp.down_proj.weight, ref["model.layers.7.mlp.down_proj.weight"]) == copied
    q = model.midlayer.self_attn.q_proj.weight
    assert torch.equal(q[:, 64:], ref["model.layers.7.self_attn.q_proj.weight"]) == copied
    assert q[:, :64].abs().max() < 0.2  # the embedding half stays small random
    # Same seed, same weights.
    again = build_draft(cfg, tiny_llama_dir, d2t, t2d, init=init, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))

    torch.manual_seed(0)
    last = torch.randn(1, 12, 64)
    logits_d, in_draft = target_from_last(last, load_target_head(tiny_llama_dir), model.d2t, model.t2d)
    r = ttt_forward(model, torch.randint(0, 49152, (1, 12)), torch.randn(1, 12, 192), logits_d,
                    torch.ones_like(in_draft), torch.ones(1, 12), ttt_length=2)
    r.loss.backward()
    assert torch.isfinite(r.loss) and model.fc.weight.grad.abs().sum() > 0


def test_build_draft_rejects_unknown_init(tiny_llama_dir):
    cfg = DraftConfig.from_target_dir(tiny_llama_dir, draft_vocab_size=300)
    with pytest.raises(InputError, match="init"):
        build_draft(cfg, tiny_llama_dir, *_vocab(), init="zeros")


def test_read_target_tensors_sharded_and_tied(tmp_path, tiny_llama_dir):
    """A sharded target (index json) is read by name; a tied one answers lm_head with the embedding."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    full = load_file(f"{tiny_llama_dir}/model.safetensors")
    names = sorted(n for n in full if n != "lm_head.weight")  # tied: no lm_head tensor
    half = len(names) // 2
    save_file({n: full[n] for n in names[:half]}, str(tmp_path / "a.safetensors"))
    save_file({n: full[n] for n in names[half:]}, str(tmp_path / "b.safetensors"))
    index = {n: ("a.safetensors" if i < half else "b.safetensors") for i, n in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    shutil.copy(f"{tiny_llama_dir}/config.json", tmp_path / "config.json")
    got = read_target_tensors(str(tmp_path), ["model.norm.weight", "model.layers.7.mlp.up_proj.weight",
                                              "lm_head.weight", "model.nonexistent"])
    assert set(got) == {"model.norm.weight", "model.layers.7.mlp.up_proj.weight", "lm_head.weight"}
    assert torch.equal(got["lm_head.weight"], full["model.embed_tokens.weight"])
    assert torch.equal(got["model.layers.7.mlp.up_proj.weight"], full["model.layers.7.mlp.up_proj.weight"])
