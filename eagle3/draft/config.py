"""The draft's architecture config, built from the target's Hugging Face config.

Torch-free on purpose: the CLI and the export stage read it for `--help` and
for writing SGLang's config.json.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from eagle3.config import from_dict, renamed_fields
from eagle3.errors import InputError

# Rope variants the draft implements (eagle3/draft/model.py:rope_inv_freq).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# Draft architectures (docs/draft.md "EAGLE 3.1"): "eagle3.1" adds an RMSNorm per aux block before fc
# (vLLM's `fc_norm`) and feeds the post-norm hidden to the next step (vLLM's `norm_output`).
DRAFT_VARIANTS = ("eagle3", "eagle3.1")
DEFAULT_DRAFT_VARIANT = "eagle3"
# P-EAGLE (docs/draft.md "P-EAGLE"): the input token of every parallel-drafting slot after the first. Any id
# works (its embedding is the target's, frozen; the learned mask_hidden carries the slot); vLLM reads it from
# config.json `mask_token_id`.
DEFAULT_MASK_TOKEN_ID = 0
# Training-time test (eagle3/draft/ttt.py): the chain length trained, and step i's loss weight DEFAULT_STEP_DECAY ** i.
DEFAULT_TTT_LENGTH = 7
DEFAULT_STEP_DECAY = 0.8


@renamed_fields
@dataclass(frozen=True)
class DraftConfig:
    """Shapes of the one-layer EAGLE-3 draft; every value mirrors the target."""

    hidden_size: int
    """H: the target's hidden size (the draft's residual stream is H wide)."""
    intermediate_size: int
    """The MLP's inner width (the target's)."""
    num_attention_heads: int
    """Query heads (the target's)."""
    num_key_value_heads: int
    """Key/value heads (GQA, the target's)."""
    head_dim: int
    """Per-head width; the target's `head_dim`, else hidden_size // heads."""
    rms_norm_eps: float
    """RMSNorm epsilon (the target's)."""
    rope_theta: float
    """Rotary base (the target's)."""
    max_position_embeddings: int
    """The target's context length (written to SGLang's config)."""
    vocab_size: int
    """V: the target's vocabulary (t2d is V long)."""
    draft_vocab_size: int
    """Vd: the draft lm_head's rows (d2t is Vd long)."""
    aux_layers: tuple[int, ...]
    """Target layers whose *outputs* form aux = cat(...) (3 ids; SGLang's meaning)."""
    rope_scaling: dict[str, Any] | None = None
    """The target's rope scaling dict (`rope_type` linear/llama3) or None."""
    hidden_act: str = "silu"
    """MLP activation: always silu (what LlamaForCausalLMEagle3 in SGLang/vLLM builds), whatever the target's."""
    variant: str = DEFAULT_DRAFT_VARIANT
    """Draft architecture: "eagle3", or "eagle3.1" (fc_norm: an RMSNorm per aux block before fc; norm_output:
    the next step is fed the post-norm hidden). Checkpoints written before this field read as "eagle3"."""
    sliding_window: int = 0
    """Step-0 keys a query attends: the last ``sliding_window`` positions of its sample, itself included (0:
    the whole sample). Exported as config.json `sliding_window` + `layer_types`, which vLLM 0.32 reads;
    SGLang's draft ignores it (docs/train.md "Sliding-window draft attention")."""
    parallel_drafting: bool = False
    """P-EAGLE: all k draft tokens of a round from ONE forward, slot 0 as in EAGLE-3 and slots 1..k-1 fed
    (mask_token_id, fc(mask_hidden)) at the next positions (vLLM's `parallel_drafting`; docs/draft.md
    "P-EAGLE"). Adds the learned `mask_hidden` [3H]. Checkpoints written before this field read as False."""
    mask_token_id: int = DEFAULT_MASK_TOKEN_ID
    """P-EAGLE: the input token of slots 1..k-1 (exported as config.json `mask_token_id`, which vLLM reads)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance (target name, fingerprint); not used by the model."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "vocab_size", "draft_vocab_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InputError(f"DraftConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise InputError(
                f"DraftConfig.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; GQA needs whole groups"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise InputError(
                f"DraftConfig.draft_vocab_size={self.draft_vocab_size} exceeds vocab_size={self.vocab_size}; "
                "pick a draft vocab no larger than the target's"
            )
        if len(self.aux_layers) != 3:
            raise InputError(f"DraftConfig.aux_layers must name 3 target layers, got {list(self.aux_layers)}")
        if self.hidden_act != "silu":
            raise InputError(f"DraftConfig.hidden_act={self.hidden_act!r} is not supported; only 'silu' is")
        rope_type = rope_type_of(self.rope_scaling)
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise InputError(
                f"DraftConfig.rope_scaling has rope_type={rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if not isinstance(self.sliding_window, int) or self.sliding_window < 0:
            raise InputError(f"DraftConfig.sliding_window must be an int >= 0 (0: off), got {self.sliding_window!r}")
        if self.variant not in DRAFT_VARIANTS:
            raise InputError(f"DraftConfig.variant={self.variant!r} is not one of {', '.join(DRAFT_VARIANTS)}")
        if not isinstance(self.parallel_drafting, bool):
            raise InputError(f"DraftConfig.parallel_drafting must be true or false, got {self.parallel_drafting!r}")
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < self.vocab_size:
            raise InputError(f"DraftConfig.mask_token_id={self.mask_token_id!r} must be a token id in "
                             f"0..{self.vocab_size - 1}")
        object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))

    @property
    def fc_norm(self) -> bool:
        """An RMSNorm on each aux block before fc (vLLM's `fc_norm`; weights `fc_norm.{i}.weight`)."""
        return self.variant == "eagle3.1"

    @property
    def norm_output(self) -> bool:
        """The next step is fed norm(out) (the hidden the lm_head reads) instead of out (vLLM's `norm_output`)."""
        return self.variant == "eagle3.1"

    @classmethod
    def from_target(cls, target: dict[str, Any], draft_vocab_size: int,
                    aux_layers: list[int] | None = None, variant: str = DEFAULT_DRAFT_VARIANT,
                    sliding_window: int = 0, parallel_drafting: bool = False, **extra: Any) -> "DraftConfig":
        """Mirror a target's HF config dict (transformers 4 or 5 layout).

        ``aux_layers`` defaults to EAGLE-3's [1, L/2-1, L-4] (layer outputs).
        """
        from eagle3.target import config_vocab_size, default_aux_layers

        def need(key: str) -> Any:
            if key not in target:
                raise InputError(f"target config.json has no {key!r}; is it a Llama-style causal LM config?")
            return target[key]

        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        theta, scaling = rope_of(target)
        return cls(
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_attention_heads=heads,
            num_key_value_heads=int(target.get("num_key_value_heads") or heads),
            head_dim=int(target.get("head_dim") or hidden // heads),
            rms_norm_eps=float(target.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=dict(scaling) if scaling else None,
            max_position_embeddings=int(target.get("max_position_embeddings", 4096)),
            vocab_size=config_vocab_size(target, "target config.json"),
            draft_vocab_size=int(draft_vocab_size),
            aux_layers=tuple(aux_layers or default_aux_layers(int(need("num_hidden_layers")))),
            # The draft layer is SGLang's and vLLM's LlamaForCausalLMEagle3, whose LlamaMLP takes
            # SiLU only: a GELU target (Gemma) still gets a SiLU draft, trained from its aux states.
            hidden_act="silu",
            variant=variant,
            sliding_window=int(sliding_window),
            parallel_drafting=bool(parallel_drafting),
            extra={"target_model_type": str(target.get("model_type", "")),
                   "target_hidden_act": str(target.get("hidden_act") or target.get("hidden_activation") or "silu"),
                   **extra},
        )

    @classmethod
    def from_target_dir(cls, model_dir: str, draft_vocab_size: int,
                        aux_layers: list[int] | None = None, variant: str = DEFAULT_DRAFT_VARIANT,
                        **extra: Any) -> "DraftConfig":
        """`from_target` on ``model_dir/config.json`` (local or s3)."""
        from eagle3.target import read_config

        return cls.from_target(read_config(model_dir), draft_vocab_size, aux_layers, variant, **extra)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; `from_dict` inverts it. This is the checkpoint's config.json."""
        d = dataclasses.asdict(self)
        d["aux_layers"] = list(self.aux_layers)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "draft config") -> "DraftConfig":
        """Inverse of `to_dict`; unknown keys are refused (they name ``where``). A checkpoint written before the
        rename (``aux_layer_ids``) reads with a deprecation message (eagle3.config.RENAMED)."""
        return from_dict(cls, data, where)


def rope_of(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None) of an HF config dict, transformers 4 or 5 layout (5 keeps both inside
    rope_parameters)."""
    rope = dict(config.get("rope_parameters") or {})
    if isinstance(rope.get("full_attention"), dict):
        # Per layer type (Gemma 3: sliding 10k, full 1M). The draft attends over the whole
        # context, as the target's full-attention layers do (SGLang's draft has no window).
        rope = dict(rope["full_attention"])
    theta = float(config.get("rope_theta", rope.pop("rope_theta", 10000.0)))
    scaling = config.get("rope_scaling") or (rope if rope_type_of(rope) != "default" else None)
    return theta, scaling


def rope_type_of(scaling: dict[str, Any] | None) -> str:
    """The rope variant of a scaling dict (HF spells it `rope_type` or `type`)."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type") or scaling.get("type") or "default")
