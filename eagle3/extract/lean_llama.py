"""A lean forward of Llama-architecture targets, for extraction on CPU, in fp32 or bf16.

In fp32, the transformers forward's numbers (tests/extract/test_lean_llama.py
compares every captured layer), with fewer memory passes. On CPU every
elementwise op is a trip through memory and the profile of the HF forward was
mm 59%, elementwise 26%, attention 13%. What changes here:

- RMSNorm weights are folded into the next projection (W·diag(w)), so a norm
  is one reduction and one multiply;
- q/k/v and gate/up are one GEMM each; the residual adds happen inside the
  o_proj and down_proj GEMMs (addmm_ with beta=1); SiLU and the gate product
  run in place; the GEMMs run in row blocks whose outputs stay in cache;
- rotary runs as one complex multiply: the q/k weight rows of each head are
  permuted from the half-split (neox) layout to interleaved pairs, the same
  permutation for q and k, so q·k and the attention output are unchanged;
- attention is SDPA with is_causal and native GQA: with right padding a real
  token never sees a padded one, so no mask is needed (padded rows are junk
  and dropped by the caller).

In bf16 (the model loaded in bf16, on CPUs with a bf16 matrix engine) the
GEMMs and attention run in bf16 while the residual stream, the norms, the
rotary product and the captured states stay fp32: each GEMM output is added
into the fp32 residual, so rounding does not accumulate over the layers the
way a bf16 residual does (the transformers bf16 forward keeps it in bf16).
The stored format is unchanged: the codec rounds aux and last to bf16 as for
fp32 compute (tests/extract/test_precision.py bounds the difference).

Only plain Llama layouts qualify (`supports`); anything else (biases, sliding
windows, other activations, another rope layout) uses the HF forward. Weights
are copied once into the fused layout (the fused copies cost ~0.6x the
layer weights in extra memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MODEL_TYPES = ("llama",)
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at load time
#: rows per GEMM block: at 8K rows the GEMM outputs leave the cache; on the 2-core dev machine the
#: [rows, 2I] gate/up GEMM ran 22% slower, q/k/v 9% and o_proj 7% (1-2K rows measured best)
ROWS = 2048
COMPUTE_DTYPES = (torch.float32, torch.bfloat16)


def supports(model) -> str | None:
    """None if `model` can run here, else the reason it cannot."""
    cfg = model.config
    if cfg.model_type not in _MODEL_TYPES:
        return f"model_type {cfg.model_type!r} (lean path: {', '.join(_MODEL_TYPES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "biased projections"
    if getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    base = getattr(model, model.base_model_prefix)
    if not hasattr(base, "rotary_emb") or not hasattr(base.rotary_emb, "inv_freq"):
        return "no rotary_emb.inv_freq"
    rope_type = getattr(base.rotary_emb, "rope_type", "default")
    if rope_type not in _STATIC_ROPE:
        # dynamic/longrope recompute inv_freq from each batch's length; the copy taken here would go stale
        return f"rope_type {rope_type!r} (lean path: {', '.join(_STATIC_ROPE)})"
    if next(model.parameters()).dtype not in COMPUTE_DTYPES:
        return f"dtype {next(model.parameters()).dtype} (lean path: float32, bfloat16)"
    return None


def _interleave(n_heads: int, head_dim: int) -> torch.Tensor:
    """Row order that turns each head's (j, j + hd/2) rotary pairs into (2j, 2j + 1)."""
    half = head_dim // 2
    within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)
    return (torch.arange(n_heads)[:, None] * head_dim + within[None]).reshape(-1)


class _Layer:
    def __init__(self, layer, n_heads: int, n_kv: int, head_dim: int):
        a, m = layer.self_attn, layer.mlp
        dt = a.q_proj.weight.dtype
        # Folded in fp32, rounded once to the compute dtype.
        w_in = layer.input_layernorm.weight.detach().float()
        w_post = layer.post_attention_layernorm.weight.detach().float()
        self.eps_in = layer.input_layernorm.variance_epsilon
        self.eps_post = layer.post_attention_layernorm.variance_epsilon
        q = a.q_proj.weight.detach()[_interleave(n_heads, head_dim)]
        k = a.k_proj.weight.detach()[_interleave(n_kv, head_dim)]
        qkv = torch.cat([q, k, a.v_proj.weight.detach()]).float() * w_in
        self.qkv = qkv.to(dt).contiguous()  # [Dq + 2Dkv, H]
        self.o = a.o_proj.weight.detach()
        gate_up = torch.cat([m.gate_proj.weight.detach(), m.up_proj.weight.detach()]).float() * w_post
        self.gate_up = gate_up.to(dt).contiguous()
        self.down = m.down_proj.weight.detach()


def _add_mm(rows: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> None:
    """rows += a @ w.T: inside the GEMM in fp32 (addmm_, beta=1); in bf16 the GEMM's output is added into
    the fp32 residual (addmm_ needs one dtype)."""
    if a.dtype == rows.dtype:
        rows.addmm_(a, w.T)
    else:
        rows.add_(torch.mm(a, w.T))


def _normed(h: torch.Tensor, eps: float) -> torch.Tensor:
    """h / rms(h), without the weight (folded into the next GEMM)."""
    ms = torch.linalg.vector_norm(h, dim=-1, keepdim=True).square_().div_(h.shape[-1]).add_(eps)
    return h * ms.rsqrt_()


class LeanLlama:
    """Right-padded batches in, outputs of chosen layers and the final-norm state out."""

    def __init__(self, model):
        reason = supports(model)
        if reason:
            raise ValueError(f"lean Llama forward does not support this model: {reason}")
        cfg = model.config
        base = getattr(model, model.base_model_prefix)
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dtype = next(model.parameters()).dtype  # GEMMs and attention; the residual stream is fp32
        self.embed = base.embed_tokens.weight.detach()
        self.layers = [_Layer(layer, self.n_heads, self.n_kv, self.head_dim) for layer in base.layers]
        self.final_norm, self.final_eps = base.norm.weight.detach(), base.norm.variance_epsilon
        self.inv_freq = base.rotary_emb.inv_freq.detach().float().clone()
        self.rope_scale = float(getattr(base.rotary_emb, "attention_scaling", 1.0))
        self.scale = getattr(base.layers[0].self_attn, "scaling", self.head_dim ** -0.5)

    def _rotation(self, width: int) -> torch.Tensor:
        """[1, T, 1, hd/2] complex: e^(i·pos·inv_freq) for positions 0..T-1 (times the rope scaling)."""
        angles = torch.arange(width, dtype=torch.float32)[:, None] * self.inv_freq[None]
        rot = torch.polar(torch.full_like(angles, self.rope_scale), angles)
        return rot[None, :, None, :]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, capture: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """ids [B, T] right-padded. Returns ([output of layer i for i in capture] each [B, T, H],
        final-norm hidden [B, T, H]), fp32; rows past a sample's length are padding junk."""
        b, t = ids.shape
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        dq, dkv = nh * hd, nkv * hd
        dt = self.dtype
        h = F.embedding(ids, self.embed).reshape(b * t, -1).float()
        rot = self._rotation(t)
        saved = {}
        qkv = h.new_empty(b * t, dq + 2 * dkv, dtype=dt)
        for i, layer in enumerate(self.layers):
            for rows, out in zip(h.split(ROWS), qkv.split(ROWS)):
                torch.mm(_normed(rows, layer.eps_in).to(dt), layer.qkv.T, out=out)
            # rotate q, then k, in place (complex multiply in fp32: there is no bf16 complex type)
            qk = qkv[:, :dq + dkv] if dt == torch.float32 else qkv[:, :dq + dkv].float()
            for lo, heads in ((0, nh), (dq, nkv)):
                part = torch.view_as_complex(qk[:, lo:lo + heads * hd].view(b, t, heads, hd // 2, 2))
                part.mul_(rot)
            if qk.dtype != dt:
                qkv[:, :dq + dkv].copy_(qk)
            del qk
            q = qkv[:, :dq].view(b, t, nh, hd).transpose(1, 2)
            k = qkv[:, dq:dq + dkv].view(b, t, nkv, hd).transpose(1, 2)
            v = qkv[:, dq + dkv:].view(b, t, nkv, hd).transpose(1, 2)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=nkv != nh)
            att = att.transpose(1, 2).reshape(b * t, dq)
            for rows, att_rows in zip(h.split(ROWS), att.split(ROWS)):
                _add_mm(rows, att_rows, layer.o)  # the residual add inside the GEMM (fp32)
            for rows in h.split(ROWS):
                gate_up = _normed(rows, layer.eps_post).to(dt) @ layer.gate_up.T
                inter = gate_up.shape[1] // 2
                gate = F.silu(gate_up[:, :inter], inplace=True)
                _add_mm(rows, gate.mul_(gate_up[:, inter:]), layer.down)
            if i in capture:
                saved[i] = h.clone()
        last = _normed(h, self.final_eps).mul_(self.final_norm)
        return [saved[i].view(b, t, -1) for i in capture], last.view(b, t, -1)
