"""Export: SGLang's file layout and names, refusal of bad tensors, reload reproduces the trainer's logits."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from eagle3.errors import InputError
from eagle3.export import REQUIRED_KEYS, ExportConfig, export, load_exported_draft
from tests.draft.tiny import make_tiny_draft, tiny_batch
from tests.export.checkpoint_folder import write_checkpoint

SGLANG_NAMES = {
    "fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "norm.weight", "lm_head.weight", "d2t", "t2d",
}


def _logits(model, batch):
    with torch.no_grad():
        return model.step(batch["input_ids"][:, 1:], batch["aux"][:, :-1],
                          torch.arange(batch["input_ids"].shape[1] - 1).expand(2, -1))[0]


def test_export_layout_and_config(tmp_path):
    model = make_tiny_draft()
    write_checkpoint(tmp_path / "ckpt", model)
    summary = export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft")))
    assert sorted(p.name for p in (tmp_path / "draft").iterdir()) == ["checksums.json", "config.json", "model.safetensors"]
    assert summary["tensors"] == 15 and summary["source"].endswith("step-00000005")
    with safe_open(str(tmp_path / "draft" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("midlayer.self_attn.q_proj.weight").shape == (32, 64)  # 2H inputs
    assert names == SGLANG_NAMES == set(REQUIRED_KEYS)
    assert not any("embed" in n for n in names)
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert (cfg["vocab_size"], cfg["draft_vocab_size"], cfg["hidden_size"]) == (50, 20, 32)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 8)
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "bfloat16"
    assert {"rope_theta", "rms_norm_eps", "max_position_embeddings", "intermediate_size"} <= set(cfg)


@pytest.mark.parametrize("trained", [[1, 3, 4], [0, 2, 5]])
def test_aux_layers_are_right_for_both_engines(tmp_path, trained):
    """Trained on the OUTPUTS of layers `trained`. SGLang reads eagle_config and adds 1 (so: as trained);
    vLLM reads the top-level key first and captures the input of layer k for id k (so: trained + 1).
    Hand-computed for each engine; the export before this test had no top-level key, so vLLM captured
    every layer one too early."""
    model = make_tiny_draft(aux_layers=tuple(trained))
    write_checkpoint(tmp_path / "ckpt", model)
    export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft")))
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    sglang_inputs = [i + 1 for i in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]  # SGLang adds 1
    vllm_inputs = cfg["eagle_aux_hidden_state_layer_ids"]  # vLLM takes the top level as it is
    # Both capture the input of layer k, which is the output of layer k-1.
    assert [k - 1 for k in sglang_inputs] == [k - 1 for k in vllm_inputs] == trained
    # A config whose two keys disagree (edited by hand) is refused instead of silently capturing other layers.
    cfg["eagle_aux_hidden_state_layer_ids"] = trained
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="does not equal"):
        load_exported_draft(str(tmp_path / "draft"), model.embed_weight)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-6), ("bfloat16", 5e-2)])
def test_reloaded_export_reproduces_trainer_logits(tmp_path, dtype, tol):
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=2, t=10)
    write_checkpoint(tmp_path / "ckpt", model)
    export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft"), dtype=dtype))
    reloaded = load_exported_draft(str(tmp_path / "draft"), model.embed_weight)
    assert torch.equal(reloaded.d2t, model.d2t) and torch.equal(reloaded.t2d, model.t2d)
    torch.testing.assert_close(_logits(reloaded, batch), _logits(model, batch), rtol=tol, atol=tol)


def test_a_transformers_5_config_loads_and_a_missing_key_is_named(tmp_path):
    """rope_theta inside rope_parameters (transformers 5 writes it there) loads as the top-level key did; a key
    the loader needs and the file lacks is an InputError naming config.json, not a KeyError traceback."""
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=1, t=8)
    write_checkpoint(tmp_path / "ckpt", model)
    export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft"), dtype="float32"))
    path = tmp_path / "draft" / "config.json"
    cfg = json.loads(path.read_text())
    theta = cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    path.write_text(json.dumps(cfg))
    reloaded = load_exported_draft(str(tmp_path / "draft"), model.embed_weight)
    assert reloaded.config.rope_theta == theta
    torch.testing.assert_close(_logits(reloaded, batch), _logits(model, batch), rtol=1e-6, atol=1e-6)
    del cfg["rms_norm_eps"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="config.json has no 'rms_norm_eps'") as info:
        load_exported_draft(str(tmp_path / "draft"), model.embed_weight)
    assert str(path) in str(info.value)


def test_export_refuses_missing_or_unexpected_tensors(tmp_path):
    model = make_tiny_draft()
    write_checkpoint(tmp_path / "extra", model, extra={"embed_tokens.weight": model.embed_weight})
    with pytest.raises(InputError, match=r"unexpected tensors \['embed_tokens.weight'\]"):
        export(ExportConfig(checkpoint=str(tmp_path / "extra"), out=str(tmp_path / "d1")))
    write_checkpoint(tmp_path / "missing", model, drop=("midlayer.hidden_norm.weight",))
    with pytest.raises(InputError, match="missing tensors .*hidden_norm"):
        export(ExportConfig(checkpoint=str(tmp_path / "missing"), out=str(tmp_path / "d2")))
    assert not (tmp_path / "d1").exists() and not (tmp_path / "d2").exists()  # nothing written


def test_export_picks_step_and_rejects_bad_input(tmp_path):
    a, b = make_tiny_draft(seed=1), make_tiny_draft(seed=2)
    write_checkpoint(tmp_path / "ckpt", a, step=3)
    write_checkpoint(tmp_path / "ckpt", b, step=9)  # latest
    out = export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "d"), step=3, dtype="float32"))
    assert out["source"].endswith("step-00000003")
    assert torch.equal(load_exported_draft(str(tmp_path / "d"), a.embed_weight).fc.weight, a.fc.weight)
    with pytest.raises(InputError, match="step-00000004"):
        export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "d"), step=4))
    with pytest.raises(InputError, match="holds no complete checkpoint"):
        export(ExportConfig(checkpoint=str(tmp_path / "nothing"), out=str(tmp_path / "d")))
    with pytest.raises(InputError, match="dtype"):
        ExportConfig(checkpoint="x", out="y", dtype="int8")


def test_cli_export_to_s3(tmp_path, s3_bucket):
    from eagle3.cli import main
    from eagle3 import storage

    model = make_tiny_draft()
    write_checkpoint(tmp_path / "ckpt", model)
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", f"{s3_bucket}/draft"]) == 0
    assert storage.list_files(f"{s3_bucket}/draft") == ["checksums.json", "config.json", "model.safetensors"]
    reloaded = load_exported_draft(f"{s3_bucket}/draft", model.embed_weight)
    assert torch.equal(reloaded.d2t, model.d2t)


def test_evaluate_refuses_a_damaged_or_incomplete_draft(tmp_path):
    from eagle3.export import check_draft

    write_checkpoint(tmp_path / "ckpt", make_tiny_draft())
    draft = tmp_path / "draft"
    export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(draft)))
    check_draft(str(draft))
    weights = bytearray((draft / "model.safetensors").read_bytes())
    weights[-3] ^= 1
    (draft / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(InputError, match="model.safetensors.*differs from checksums.json.*re-run `eagle3 export"):
        check_draft(str(draft))
    (draft / "config.json").unlink()  # an export killed before its last file
    with pytest.raises(InputError, match="no config.json"):
        check_draft(str(draft))


def test_a_full_vocab_draft_is_exported_without_d2t_and_reloads(tmp_path):
    # vLLM has no draft_id_to_target_id parameter when draft vocab == target vocab and refuses a d2t tensor
    # (llama_eagle3.py); the identity map is left out and the loader restores it.
    model = make_tiny_draft(draft_vocab_size=50)
    assert not model.d2t.any() and model.t2d.all()  # sorted ids of the whole vocab: the identity
    write_checkpoint(tmp_path / "ckpt", model)
    export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft"), dtype="float32"))
    with safe_open(str(tmp_path / "draft" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == SGLANG_NAMES - {"d2t", "t2d"}
    reloaded = load_exported_draft(str(tmp_path / "draft"), model.embed_weight)
    assert torch.equal(reloaded.d2t, model.d2t) and torch.equal(reloaded.t2d, model.t2d)
    batch = tiny_batch(model.config, b=2, t=10)
    torch.testing.assert_close(_logits(reloaded, batch), _logits(model, batch))


def test_a_full_vocab_draft_whose_map_is_not_the_identity_is_refused():
    from eagle3.export import export_tensors

    model = make_tiny_draft(draft_vocab_size=50)
    state = dict(model.state_dict())
    state["d2t"] = state["d2t"].clone()
    state["d2t"][0] = 1
    with pytest.raises(InputError, match="not the identity"):
        export_tensors(state, "float32", "ckpt/model.safetensors")


def test_a_checkpoint_from_before_the_rename_exports(tmp_path, caplog):
    """A checkpoint's config.json of an older release names the aux layers ``aux_layer_ids``: it still exports
    (and resumes, through the same DraftConfig.from_dict), saying which key replaces it."""
    model = make_tiny_draft(aux_layers=(0, 2, 5))
    folder = write_checkpoint(tmp_path / "ckpt", model)
    saved = json.loads((folder / "config.json").read_text())
    saved["aux_layer_ids"] = saved.pop("aux_layers")
    (folder / "config.json").write_text(json.dumps(saved))
    with pytest.warns(DeprecationWarning, match="aux_layer_ids is deprecated, use aux_layers"):
        summary = export(ExportConfig(checkpoint=str(tmp_path / "ckpt"), out=str(tmp_path / "draft")))
    assert f"{folder / 'config.json'}: aux_layer_ids is deprecated, use aux_layers" in caplog.text
    assert summary["aux_layers"] == [0, 2, 5]
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 5]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
