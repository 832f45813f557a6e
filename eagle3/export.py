"""Write a trained draft as the directory SGLang loads with
`--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT`.

    eagle3 export --checkpoint CKPT --out DRAFT [--step N] [--dtype bfloat16]

CKPT is the trainer's checkpoint folder (latest.json -> step-<n>/ with
model.safetensors + config.json), or one step folder. DRAFT gets config.json
(`LlamaForCausalLMEagle3`, one layer, the target's shapes, `draft_vocab_size`,
`eagle_config.eagle_aux_hidden_state_layer_ids`, the EAGLE 3.1 switches), model.safetensors
(fc, midlayer.*, norm, lm_head, d2t, t2d, and fc_norm.{i} for EAGLE 3.1; no embed_tokens:
SGLang and vLLM reuse the target's embedding) and checksums.json. A full-vocab draft (draft_vocab_size
== vocab_size) has no d2t/t2d: the map is the identity, and vLLM refuses a d2t then.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from eagle3 import storage
from eagle3.errors import InputError

log = logging.getLogger(__name__)

# Checkpoint tensor name -> the name SGLang's LlamaForCausalLMEagle3.load_weights
# expects. The draft's modules already carry SGLang's names, so today this is an
# identity map; it is still the one place that lists what must be exported, and
# SGLang silently skips names it does not know, so nothing else may be written.
WEIGHT_NAMES: dict[str, str] = {
    "fc.weight": "fc.weight",
    "midlayer.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "d2t": "d2t",
    "t2d": "t2d",
}
REQUIRED_KEYS: list[str] = list(WEIGHT_NAMES.values())
# EAGLE 3.1 adds one RMSNorm per aux block before fc: vLLM 0.32 loads them as `fc_norm.{i}.weight`
# (LlamaModel.fc_norm of model_executor/models/llama_eagle3.py) when config.json says `fc_norm: true`.
WEIGHT_NAMES_3_1: dict[str, str] = {f"fc_norm.{i}.weight": f"fc_norm.{i}.weight" for i in range(3)}
# P-EAGLE adds the aux stand-in of the parallel slots: vLLM 0.32 loads `mask_hidden` (any shape of 3H values)
# into Eagle3LlamaForCausalLM.mask_hidden when served with parallel_drafting, and refuses to start without it.
WEIGHT_NAMES_PARALLEL: dict[str, str] = {"mask_hidden": "mask_hidden"}


def weight_names(variant: str = "eagle3", parallel_drafting: bool = False) -> dict[str, str]:
    """Checkpoint name -> exported name for a draft variant (eagle3.draft.config.DRAFT_VARIANTS), with P-EAGLE's
    mask_hidden when ``parallel_drafting``."""
    names = {**WEIGHT_NAMES, **WEIGHT_NAMES_3_1} if variant == "eagle3.1" else dict(WEIGHT_NAMES)
    return {**names, **WEIGHT_NAMES_PARALLEL} if parallel_drafting else names
# Kept in their own dtype: SGLang computes hot tokens as d2t + arange (int64), t2d is a mask.
INDEX_KEYS = ("d2t", "t2d")
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ExportConfig:
    """What to export and where."""

    checkpoint: str
    """CKPT folder with latest.json, or a step-<n> folder (local or s3://)."""
    out: str
    """Destination DRAFT folder (local or s3://); its two files are replaced."""
    step: int | None = None
    """Export CKPT/step-<n> instead of the one latest.json points at."""
    dtype: str = "bfloat16"
    """Float dtype of the exported weights (config.json `torch_dtype`)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InputError(f"export dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")


def read_checkpoint(step_dir: str):
    """(DraftConfig, {name: tensor}) of one step folder."""
    from eagle3.checkpoint import CONFIG_FILE, read_step
    from eagle3.draft.config import DraftConfig

    raw, tensors = read_step(step_dir)
    return DraftConfig.from_dict(raw.get("draft", raw), where=storage.join(step_dir, CONFIG_FILE)), tensors


def export_tensors(state: dict[str, Any], dtype: str, where: str, variant: str = "eagle3",
                   parallel_drafting: bool = False) -> dict[str, Any]:
    """Rename to SGLang's/vLLM's names; refuse missing or unexpected tensors."""
    import torch

    names = weight_names(variant, parallel_drafting)
    missing = sorted(k for k in names if k not in state)
    unexpected = sorted(k for k in state if k not in names)
    if missing or unexpected:
        raise InputError(
            f"{where}: cannot export; missing tensors {missing}, unexpected tensors {unexpected}. "
            f"An {variant}{' P-EAGLE' if parallel_drafting else ''} draft needs exactly {sorted(names)} (embed_tokens must not be saved)"
        )
    out = {}
    for src, dst in names.items():
        t = state[src]
        out[dst] = t.contiguous() if src in INDEX_KEYS else t.to(getattr(torch, dtype)).contiguous()
    out["d2t"], out["t2d"] = out["d2t"].to(torch.int64), out["t2d"].to(torch.bool)
    assert sorted(out) == sorted(names.values())
    if out["d2t"].shape[0] == out["t2d"].shape[0]:
        # A full-vocab draft (draft vocab = the target's): vLLM then has no draft_id_to_target_id parameter and
        # refuses a d2t tensor ("There is no module or parameter named ..."); SGLang and our loader read no
        # d2t as the identity, so neither map is written. Only the identity map may be dropped.
        if bool(out["d2t"].any()) or not bool(out["t2d"].all()):
            raise InputError(f"{where}: draft_vocab_size equals the target's vocab ({out['t2d'].shape[0]}) but "
                             "d2t is not the identity; a full-vocab draft must map draft id i to target id i")
        del out["d2t"], out["t2d"]
    return out


def engine_aux_layer_keys(trained: list[int]) -> dict[str, Any]:
    """The aux-layer keys of the draft's config.json, right for both engines.

    Ours are the target layers whose OUTPUT feeds the draft (hidden_states[i+1] in HF terms).
    - SGLang reads only ``eagle_config.eagle_aux_hidden_state_layer_ids`` and adds 1 itself ("for the
      ith layer, it takes the output of the (i-1)th layer", LlamaForCausalLM.set_eagle3_layers_to_capture):
      the trained ids go there unchanged.
    - vLLM (0.32, gpu_model_runner / eagle3_utils) reads a top-level ``eagle_aux_hidden_state_layer_ids``
      first and uses it as it is, and its Llama captures ``hidden_states + residual`` BEFORE layer k for
      id k, i.e. the output of layer k-1: the top level holds the trained ids + 1. Without it vLLM would
      take the eagle_config values as they are and capture layers one too early (measured on the demo
      draft: τ 1.70 instead of 1.83).
    """
    return {"eagle_aux_hidden_state_layer_ids": [int(i) + 1 for i in trained],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [int(i) for i in trained],
                             "use_aux_hidden_state": True}}


def trained_aux_layers(config: dict, where: str) -> list[int]:
    """The aux layer ids (layer outputs) a draft's config.json was trained on; refuses a config whose two
    keys disagree (an edited export), since each engine would then capture other layers."""
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(ids, list) or len(ids) != 3 or not all(isinstance(i, int) for i in ids):
        raise InputError(f"eagle_config.eagle_aux_hidden_state_layer_ids must list 3 layer ids, got {ids!r}; "
                         "re-export the draft with `eagle3 export`", file=where)
    top = config.get("eagle_aux_hidden_state_layer_ids")
    if top is not None and top != [i + 1 for i in ids]:
        raise InputError(f"eagle_aux_hidden_state_layer_ids {top} (vLLM's, layer inputs) does not equal "
                         f"eagle_config's {ids} + 1 (SGLang's, layer outputs); re-export the draft", file=where)
    return ids


def draft_config_json(cfg, dtype: str) -> dict[str, Any]:
    """config.json of the exported draft: SGLang's and vLLM's LlamaForCausalLMEagle3.

    The aux layer ids: :func:`engine_aux_layer_keys`. SGLang's default with no ids, [2, L/2, L-3] as
    layer inputs, equals our default [1, L/2-1, L-4] as outputs. `tie_word_embeddings` must be false:
    SGLang would otherwise use the embedding as lm_head (SmolLM2 itself is tied).
    """
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
        **engine_aux_layer_keys(list(cfg.aux_layers)),
        **variant_keys(cfg),
        **window_keys(cfg),
        **parallel_keys(cfg),
    }


def parallel_keys(cfg) -> dict[str, Any]:
    """A P-EAGLE draft's config.json keys: vLLM 0.32 reads `mask_token_id` (LLMBaseProposer
    _init_parallel_drafting_params) when served with `parallel_drafting: true` in --speculative-config, which
    `eagle3.serving.vllm.eagle3_speculative` sets from this file's `parallel_drafting`. SGLang has no parallel
    drafter (docs/draft.md "P-EAGLE")."""
    if not cfg.parallel_drafting:
        return {}
    return {"parallel_drafting": True, "mask_token_id": cfg.mask_token_id}


def window_keys(cfg) -> dict[str, Any]:
    """A sliding-window draft as vLLM 0.32's Llama attention reads it (model_executor/models/llama.py: the
    draft's layer 0 is windowed when `layer_types[0]` is "sliding_attention", by `sliding_window`). SGLang's
    LlamaForCausalLMEagle3 builds its attention without a window: it would attend the whole context."""
    if not cfg.sliding_window:
        return {}
    return {"sliding_window": cfg.sliding_window, "layer_types": ["sliding_attention"]}


def variant_keys(cfg) -> dict[str, Any]:
    """The EAGLE 3.1 switches of config.json, as vLLM 0.32 reads them (model_executor/models/llama_eagle3.py):
    top-level `fc_norm` (an RMSNorm per aux block before fc, weights fc_norm.{i}.weight) and `norm_output`
    (the next step is fed the post-norm hidden). Written for both variants, so the file says which one it is;
    `norm_before_fc` (one norm over all 3H) and `norm_before_residual` (the residual stream starts from
    hidden_norm(h)) are other variants, not trained here, written false. SGLang's LlamaForCausalLMEagle3 reads
    none of them (docs/draft.md "EAGLE 3.1"): it would run a 3.1 draft as plain EAGLE-3."""
    return {"draft_variant": cfg.variant, "fc_norm": cfg.fc_norm, "norm_output": cfg.norm_output,
            "norm_before_fc": False, "norm_before_residual": False}


def export(cfg: ExportConfig) -> dict[str, Any]:
    """Write DRAFT from the checkpoint; return a small summary."""
    from eagle3.extract.store import save_safetensors

    from eagle3.checkpoint import resolve_step

    step_dir = resolve_step(cfg.checkpoint, cfg.step)
    draft_cfg, state = read_checkpoint(step_dir)
    tensors = export_tensors(state, cfg.dtype, storage.join(step_dir, "model.safetensors"), draft_cfg.variant,
                             draft_cfg.parallel_drafting)
    if draft_cfg.parallel_drafting:
        log.warning("%s is a P-EAGLE (parallel drafting) draft: vLLM (>= 0.32) serves it with parallel_drafting "
                    "in --speculative-config; SGLang has no parallel drafter (docs/draft.md)", step_dir)
    if draft_cfg.variant != "eagle3":
        log.warning("%s is an %s draft: vLLM (>= 0.32) serves it; SGLang's LlamaForCausalLMEagle3 ignores fc_norm "
                    "and norm_output and would run it as plain EAGLE-3 (docs/draft.md)", step_dir, draft_cfg.variant)
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:
        raise InputError(f"{step_dir}: NaN or inf in {', '.join(sorted(bad))} (the training diverged before this "
                         "step was saved): export an earlier step (--step N) or train again with a lower lr")
    full_vocab = "d2t" not in tensors
    if full_vocab and draft_cfg.draft_vocab_size != draft_cfg.vocab_size:
        raise InputError(f"{step_dir}: d2t covers the whole vocabulary but the draft config says draft_vocab_size "
                         f"{draft_cfg.draft_vocab_size} < vocab_size {draft_cfg.vocab_size}")
    if not full_vocab and (tensors["t2d"].shape[0] != draft_cfg.vocab_size
                           or tensors["d2t"].shape[0] != draft_cfg.draft_vocab_size):
        raise InputError(f"{step_dir}: t2d has {tensors['t2d'].shape[0]} entries and d2t {tensors['d2t'].shape[0]}, "
                         f"but the draft config says vocab_size {draft_cfg.vocab_size} (the target's lm_head rows, "
                         f"which SGLang and vLLM index t2d over) and draft_vocab_size {draft_cfg.draft_vocab_size}")
    config = draft_config_json(draft_cfg, cfg.dtype)
    # Weights first, then their checksum, config last: a DRAFT with a config.json is complete.
    storage.sweep_tmp(cfg.out)  # temp files of killed exports (never a live one's)
    storage.delete(storage.join(cfg.out, "config.json"))  # a killed re-export must not look complete
    # The header written with sorted keys (safetensors' own writer orders metadata by hash: other bytes each run).
    with storage.atomic_file(storage.join(cfg.out, "model.safetensors")) as tmp:
        save_safetensors(tensors, str(tmp), {"format": "pt", "source": step_dir})
        sha, size = storage.sha256_file(tmp), tmp.stat().st_size
    storage.write_json(storage.join(cfg.out, CHECKSUMS), {"model.safetensors": sha})
    storage.write_json(storage.join(cfg.out, "config.json"), config)
    summary = {"out": cfg.out, "source": step_dir, "tensors": len(tensors), "bytes": size,
               "draft_variant": draft_cfg.variant, "parallel_drafting": draft_cfg.parallel_drafting,
               "sha256": sha, "dtype": cfg.dtype, "draft_vocab_size": draft_cfg.draft_vocab_size,
               "aux_layers": list(draft_cfg.aux_layers)}
    log.info("exported %s -> %s (%d tensors, %.1f MB)", step_dir, cfg.out, len(tensors), size / 1e6)
    return summary


def capture_draft_config(target_config: dict, aux_layers: list[int], tensor_parallel: int = 1):
    """The DraftConfig of a capture draft (:func:`write_capture_draft`) for a target's config.json dict.

    Only the hidden size (fc maps the target's 3H to H; the embedding is the target's) and the aux layer
    ids matter; the rest is picked to load anywhere at little cost: 128-wide heads, as many query and
    key/value heads as a multiple of the tensor parallel size near 8 (SGLang splits heads over its TP
    ranks; MLA targets' own head widths, e.g. 56, are not attention-kernel sizes), a 128 x tp MLP, a
    small vocab, and no rope scaling (the draft's predictions are never read)."""
    import dataclasses
    import math

    from eagle3.draft.config import DraftConfig
    from eagle3.target import config_vocab_size

    tp = max(int(tensor_parallel), 1)
    heads = tp * math.ceil(8 / tp)
    rope = target_config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope) if isinstance(rope.get("full_attention"), dict) else rope
    plain = {**target_config, "rope_scaling": None, "rope_parameters": None,
             "rope_theta": target_config.get("rope_theta", rope.get("rope_theta", 10000.0))}
    vd = min(config_vocab_size(target_config, "target config.json"), CAPTURE_DRAFT_VOCAB)
    cfg = DraftConfig.from_target(plain, vd, aux_layers=list(aux_layers))
    return dataclasses.replace(cfg, num_attention_heads=heads, num_key_value_heads=heads, head_dim=128,
                               intermediate_size=128 * tp)


def write_capture_draft(target_config: dict, aux_layers: list[int], out: str, tensor_parallel: int = 1) -> dict:
    """Write a draft folder (this export's format, all weights zero, d2t the identity) whose only job is to
    make SGLang capture ``aux_layers`` when it serves the target as this draft's target: SGLang reads
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` from the draft and captures the output of each layer
    listed (the sglang extract engine, eagle3/extract/sglang_engine.py). Built from the target's config.json
    alone: no target weight is read. Returns the written tensors' shapes."""
    import os

    import torch

    from eagle3.draft.model import Eagle3Draft
    from eagle3.extract.store import save_safetensors

    cfg = capture_draft_config(target_config, aux_layers, tensor_parallel)
    v, vd, h = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size
    with torch.device("meta"):  # the draft module owns the tensor shapes; nothing is allocated here
        shapes = {k: t.shape for k, t in Eagle3Draft(cfg, torch.empty(v, h), torch.zeros(vd, dtype=torch.int64),
                                                     torch.zeros(v, dtype=torch.bool)).state_dict().items()}
    state = {k: torch.zeros(shape, dtype=torch.bfloat16) for k, shape in shapes.items()}
    state["d2t"], state["t2d"] = torch.zeros(vd, dtype=torch.int64), torch.arange(v) < vd
    tensors = export_tensors(state, "bfloat16", out, cfg.variant)
    os.makedirs(out, exist_ok=True)
    save_safetensors(tensors, os.path.join(out, "model.safetensors"), {"format": "pt", "source": "capture draft"})
    storage.write_json(os.path.join(out, "config.json"), draft_config_json(cfg, "bfloat16"))
    return {k: list(t.shape) for k, t in tensors.items()}


CAPTURE_DRAFT_VOCAB = 1024
"""Rows of a capture draft's lm_head (at most the target's vocab): SGLang drafts from it, nobody reads it."""


CHECKSUMS = "checksums.json"
"""{file: sha256} of an exported draft's weights; engines ignore it, evaluate checks it (:func:`check_draft`)."""


def check_draft(draft_dir: str) -> None:
    """Refuse an exported draft that is incomplete or whose weights differ from the sha256 export recorded
    (InputError naming the file and the repair). A draft exported before checksums were recorded passes."""
    repair = f"re-run `eagle3 export --out {draft_dir}` from the checkpoint"
    if not storage.exists(storage.join(draft_dir, "config.json")):
        raise InputError(f"no config.json: not a complete `eagle3 export` output; {repair}", file=draft_dir)
    sums_uri = storage.join(draft_dir, CHECKSUMS)
    if not storage.exists(sums_uri):
        log.warning("%s has no %s (exported by an older version); its weights are not checked", draft_dir, CHECKSUMS)
        return
    for name, want in storage.read_json(sums_uri).items():
        uri = storage.join(draft_dir, name)
        if not storage.exists(uri):
            raise InputError(f"missing, but listed in {CHECKSUMS}; {repair}", file=uri)
        storage.check_sha256(uri, want, repair, recorded_in=CHECKSUMS)


def exported_variant(config: dict, where: str) -> str:
    """The draft variant of an exported config.json, from the switches vLLM reads (an export without them
    is plain EAGLE-3); refuses combinations this project's decoder does not run the way vLLM would."""
    flags = {k: bool(config.get(k, False)) for k in ("fc_norm", "norm_output", "norm_before_fc",
                                                       "norm_before_residual")}
    flags["norm_before_fc"] = bool((config.get("eagle_config") or {}).get("norm_before_fc", flags["norm_before_fc"]))
    if flags == {"fc_norm": False, "norm_output": False, "norm_before_fc": False, "norm_before_residual": False}:
        return "eagle3"
    if flags == {"fc_norm": True, "norm_output": True, "norm_before_fc": False, "norm_before_residual": False}:
        return "eagle3.1"
    raise InputError(f"unsupported EAGLE-3 switches {flags}: this project runs eagle3 (all false) and eagle3.1 "
                     "(fc_norm and norm_output true)", file=where)


def exported_parallel(config: dict, where: str) -> bool:
    """Whether an exported config.json is a P-EAGLE draft (`parallel_keys`); refuses one without its
    mask_token_id, which vLLM needs too."""
    parallel = config.get("parallel_drafting", False)
    if not isinstance(parallel, bool):
        raise InputError(f"parallel_drafting must be true or false, got {parallel!r}", file=where)
    if parallel and not isinstance(config.get("mask_token_id"), int):
        raise InputError("a parallel_drafting draft needs an integer mask_token_id (the slots' input token); "
                         "re-export the draft with `eagle3 export`", file=where)
    return parallel


def draft_is_parallel(draft_dir: str) -> bool:
    """`exported_parallel` of a draft folder's config.json; False when the folder has none (a draft the
    engine resolves itself)."""
    config = storage.join(draft_dir, "config.json")
    return storage.exists(config) and exported_parallel(storage.read_json(config), config)


def _need(config: dict, key: str, path: str):
    if key not in config:
        raise InputError(f"the draft's config.json has no {key!r}: it was not written by `eagle3 export` (or was "
                         "edited); export the draft again from its checkpoint", file=path)
    return config[key]


def exported_vocab(draft_dir: str) -> frozenset[int]:
    """The target ids an exported draft can propose: i + d2t[i] for its Vd tokens, as vLLM and SGLang map them;
    every id of a full-vocab export (no d2t)."""
    from safetensors import safe_open

    path = storage.join(draft_dir, "config.json")
    c = storage.read_json(path)
    with safe_open(storage.local_path(storage.join(draft_dir, "model.safetensors")), "numpy") as f:
        if "d2t" not in f.keys():
            return frozenset(range(int(_need(c, "vocab_size", path))))
        d2t = f.get_tensor("d2t")
    return frozenset((d2t + range(len(d2t))).tolist())


def load_exported_draft(draft_dir: str, embed_weight, device: str = "cpu"):
    """An Eagle3Draft (fp32) from an export's two files plus the target's embedding."""
    import torch
    from safetensors.torch import load_file

    from eagle3.draft.config import DEFAULT_MASK_TOKEN_ID, DraftConfig, rope_of
    from eagle3.draft.model import Eagle3Draft

    path = storage.join(draft_dir, "config.json")
    c = storage.read_json(path)
    if c.get("architectures") != ["LlamaForCausalLMEagle3"]:
        raise InputError(f"{draft_dir}/config.json is not an EAGLE3 draft (architectures={c.get('architectures')})")
    parallel = exported_parallel(c, path)
    need = functools.partial(_need, c, path=path)
    theta, scaling = rope_of(c)  # a transformers-5 config keeps them in rope_parameters
    heads = need("num_attention_heads")
    cfg = DraftConfig(
        hidden_size=need("hidden_size"), intermediate_size=need("intermediate_size"),
        num_attention_heads=heads, num_key_value_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or need("hidden_size") // heads,
        rms_norm_eps=need("rms_norm_eps"), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=need("max_position_embeddings"), vocab_size=need("vocab_size"),
        draft_vocab_size=c.get("draft_vocab_size") or need("vocab_size"),  # absent: full vocab, as vLLM reads it
        aux_layers=tuple(trained_aux_layers(c, storage.join(draft_dir, "config.json"))),
        hidden_act=c.get("hidden_act", "silu"),
        variant=exported_variant(c, storage.join(draft_dir, "config.json")),
        sliding_window=int(c.get("sliding_window") or 0),
        parallel_drafting=parallel,
        mask_token_id=int(c["mask_token_id"]) if parallel else DEFAULT_MASK_TOKEN_ID,
    )
    raw = load_file(storage.local_path(storage.join(draft_dir, "model.safetensors")))
    by_export_name = {v: k for k, v in weight_names(cfg.variant, cfg.parallel_drafting).items()}
    state = {by_export_name.get(k, k): (v if k in INDEX_KEYS else v.float()) for k, v in raw.items()}
    if "d2t" not in state and cfg.draft_vocab_size == cfg.vocab_size:  # a full-vocab export (export_tensors)
        state["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.int64)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    model = Eagle3Draft.from_state_dict(cfg, state, embed_weight.float())
    return model.to(torch.device(device)).eval()

