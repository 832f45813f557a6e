"""Build a fresh draft from the target: its frozen embedding plus an init.

Only the tensors the draft needs are read from the target's safetensors files
(embedding, last decoder layer, final norm, lm_head), so a 1T-parameter target
never has to fit in memory here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.draft.config import DraftConfig
from eagle3.draft.model import Eagle3Draft
from eagle3.errors import InputError

INIT_CHOICES = ("target", "random")
_INIT_STD = 0.02  # the Llama initializer_range


def read_target_tensors(model_dir: str, names: list[str]) -> dict[str, torch.Tensor]:
    """Load the named tensors of an HF model dir (single file or sharded index).

    A tied target has no `lm_head.weight`: it is answered with the embedding.
    Missing names are left out of the result (the caller decides).
    """
    from safetensors import safe_open

    from eagle3.target import resolve_model

    root = Path(resolve_model(model_dir))
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
    elif (root / "model.safetensors").exists():
        with safe_open(str(root / "model.safetensors"), "pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}
    else:
        raise InputError(f"{root} has no model.safetensors(.index.json); the draft reads target weights from safetensors")
    wanted = {n: n for n in names}
    if "lm_head.weight" in wanted and "lm_head.weight" not in weight_map:
        wanted["lm_head.weight"] = "model.embed_tokens.weight"  # tie_word_embeddings
    by_file: dict[str, list[str]] = {}
    for name, source in wanted.items():
        if source in weight_map:
            by_file.setdefault(weight_map[source], []).append(name)
    out = {}
    for file, group in by_file.items():
        with safe_open(str(root / file), "pt") as f:
            for name in group:
                out[name] = f.get_tensor(wanted[name])
    return out


def load_target_embedding(model_dir: str) -> torch.Tensor:
    """The target's input embedding [V, H] (the draft's frozen embedding)."""
    t = read_target_tensors(model_dir, ["model.embed_tokens.weight"])
    if not t:
        raise InputError(f"target {model_dir} has no model.embed_tokens.weight")
    return t["model.embed_tokens.weight"].float()


def load_target_head(model_dir: str) -> torch.Tensor:
    """The target's lm_head [V, H] (the embedding when tied), for `target_from_last`."""
    return read_target_tensors(model_dir, ["lm_head.weight"])["lm_head.weight"].float()


def _num_layers(model_dir: str) -> int:
    from eagle3.target import config_int, read_config

    return config_int(read_config(model_dir), "num_hidden_layers", model_dir)


def build_draft(cfg: DraftConfig, target_dir: str, d2t: torch.Tensor, t2d: torch.Tensor,
                init: str = "target", seed: int = 0) -> Eagle3Draft:
    """A fresh fp32 draft for a target (a model dir, s3 prefix or alias).

    init="random": every Linear ~ N(0, 0.02), norms 1, seeded by ``seed``.
    init="target": as random, then copied from the target where shapes allow:
      midlayer <- the target's last decoder layer (o/gate/up/down, the norms);
      q/k/v take the target's weights in their hidden half (columns H:2H) and
      keep the small random values in the embedding half; fc selects the last
      aux block (identity on the deepest captured layer); norm <- final norm;
      lm_head <- the target's lm_head rows of the draft vocab (i + d2t[i]).
    Gemma targets: norms are copied as 1 + w (Gemma's convention) and the pre-MLP norm is its
    pre_feedforward_layernorm; its GELU MLP weights seed the draft's SiLU MLP (close shapes, an init).
    The frozen embedding is the stored weight, not Gemma's sqrt(H)-scaled lookup: the draft only
    reads it through input_layernorm, which a constant scale does not change, and SGLang/vLLM hand
    the draft the target's embedding weight as it is.
    """
    if init not in INIT_CHOICES:
        raise InputError(f"draft init={init!r} is not one of {', '.join(INIT_CHOICES)}")
    embed = load_target_embedding(target_dir)
    model = Eagle3Draft(cfg, embed, d2t, t2d)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights (norm, midlayer.*norm, 3.1's fc_norm.{i})
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * _INIT_STD)
        if init == "target":
            _copy_from_target(model, target_dir)
    return model


def target_norm_offset(target_config: dict) -> float:
    """What to add to a target's stored RMSNorm weight to get its scale: 1 for Gemma (it scales by
    1 + w, weights stored around 0), 0 for Llama (scales by w)."""
    return 1.0 if str(target_config.get("model_type", "")).startswith("gemma") else 0.0


def _copy_from_target(model: Eagle3Draft, target_dir: str) -> None:
    from eagle3.target import read_config

    cfg, h = model.config, model.config.hidden_size
    target_cfg = read_config(target_dir)
    offset = target_norm_offset(target_cfg)
    last = f"model.layers.{_num_layers(target_dir) - 1}."
    # The draft's pre-MLP norm: Llama calls it post_attention_layernorm; Gemma's post_attention_layernorm
    # norms the attention output (a sandwich norm the Llama layer lacks) and pre_feedforward_layernorm
    # is the pre-MLP one.
    pre_mlp = "pre_feedforward_layernorm" if offset else "post_attention_layernorm"
    names = {  # draft name -> target name (same shape)
        "midlayer.self_attn.o_proj.weight": last + "self_attn.o_proj.weight",
        "midlayer.mlp.gate_proj.weight": last + "mlp.gate_proj.weight",
        "midlayer.mlp.up_proj.weight": last + "mlp.up_proj.weight",
        "midlayer.mlp.down_proj.weight": last + "mlp.down_proj.weight",
        "midlayer.hidden_norm.weight": last + "input_layernorm.weight",
        "midlayer.input_layernorm.weight": last + "input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight": last + pre_mlp + ".weight",
        "norm.weight": "model.norm.weight",
    }
    halves = {f"midlayer.self_attn.{p}_proj.weight": last + f"self_attn.{p}_proj.weight" for p in "qkv"}
    src = read_target_tensors(target_dir, [*names.values(), *halves.values(), "lm_head.weight"])
    params = dict(model.named_parameters())
    for mine, theirs in names.items():
        if theirs in src and src[theirs].shape == params[mine].shape:
            # The draft's RMSNorm scales by w (Llama's, as SGLang/vLLM load it): a Gemma norm's 1 + w.
            params[mine].copy_(src[theirs].float() + (offset if mine.endswith("norm.weight") else 0.0))
    for mine, theirs in halves.items():
        if theirs in src and src[theirs].shape == params[mine][:, h:].shape:
            params[mine][:, h:].copy_(src[theirs].float())
    if "lm_head.weight" in src:
        target_ids = torch.arange(cfg.draft_vocab_size) + model.d2t
        params["lm_head.weight"].copy_(src["lm_head.weight"].float()[target_ids])
    fc = params["fc.weight"]
    fc.zero_()
    fc[:, 2 * h:].copy_(torch.eye(h))
