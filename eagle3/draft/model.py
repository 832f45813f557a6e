"""The EAGLE-3 draft: one Llama decoder layer fed by the target's aux states.

Shapes (H = target hidden, V = target vocab, Vd = draft vocab):

    emb    = embed_tokens(x)                       frozen, the target's [V, H]
    h      = fc(aux) (3H -> H)  or the draft's own previous output hidden
    a      = cat(input_layernorm(emb), hidden_norm(h))          2H wide
    h'     = h + o_proj(attn(q/k/v_proj(a)))                   residual = hidden stream
    out    = h' + mlp(post_attention_layernorm(h'))            the next step's `hidden`
    logits = lm_head(norm(out))                                 [.., Vd]

EAGLE 3.1 (cfg.variant "eagle3.1", vLLM's `fc_norm` + `norm_output`): fc reads
cat(fc_norm[i](aux block i)) and the next step is fed norm(out) instead of out.

P-EAGLE (cfg.parallel_drafting, vLLM's `parallel_drafting`): slots 1..k-1 of a
round are fed (mask_token_id, fc(mask_hidden)) instead of the previous draft
token and hidden, so one forward proposes all k (`propose_parallel`).

Module names equal SGLang's LlamaForCausalLMEagle3 names (fc, midlayer.*,
norm, lm_head, d2t, t2d), so `state_dict()` is exactly the checkpoint content;
the embedding is a non-persistent buffer and never saved.

Two ways to run it:
- `step(...)` with a `DraftCache`: plain causal attention over cached keys,
  for speculative decoding (eagle3/evaluate).
- `ttt_step(...)`: training-time test (eagle3/draft/ttt.py), step-0 keys
  causal plus later steps' keys on the diagonal only; blockwise
  (eagle3/draft/attention.py, O(T) memory) or the dense reference.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from eagle3.draft.attention import ttt_attention
from eagle3.draft.config import DraftConfig, rope_type_of
from eagle3.errors import InputError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(self.weight.dtype)


def rope_inv_freq(cfg: DraftConfig) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim/2], with the target's scaling."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    kind, s = rope_type_of(cfg.rope_scaling), cfg.rope_scaling or {}
    if kind == "linear":
        inv = inv / float(s["factor"])
    elif kind == "llama3":
        # Llama 3.1: long wavelengths slowed by `factor`, short kept, a smooth band between.
        factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = ((old / wavelen) - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        band = (wavelen <= old / low) & (wavelen >= old / high)
        inv = torch.where(band, mid, scaled)
    return inv.float()


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, 1, T, head_dim] for integer positions [B, T]."""
    freqs = position_ids.float()[..., None] * inv_freq.to(position_ids.device)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Neox/HF-Llama layout (halves rotated), which SGLang's Llama uses too.
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class DraftAttention(nn.Module):
    """Attention whose q/k/v read the 2H-wide cat(emb, hidden)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(2 * h, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [B,nh,T,hd], k/v [B,nkv,T,hd], rope applied to q and k."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q, keys, values, mask, diag_keys=(), diag_values=()) -> torch.Tensor:
        """softmax over [masked q.keys | q.diag_keys at the same position].

        keys/values [B,nkv,S,hd] with mask [B,1,T,S] (True = may attend);
        each diag key/value is [B,nkv,T,hd] and only pairs with its own row.
        Returns o_proj(out) [B,T,H].
        """
        b, nh, t, hd = q.shape
        g = nh // self.num_kv_heads
        q5 = q.reshape(b, self.num_kv_heads, g, t, hd) * (1.0 / math.sqrt(hd))
        scores = [(q5 @ keys[:, :, None].transpose(-1, -2)).float()
                  .masked_fill(~mask[:, :, None], float("-inf"))]
        scores += [(q5 * k[:, :, None]).sum(-1, keepdim=True).float() for k in diag_keys]
        probs = torch.cat(scores, dim=-1).softmax(dim=-1).to(q.dtype)
        s = keys.shape[2]
        out = probs[..., :s] @ values[:, :, None]
        for j, v in enumerate(diag_values):
            out = out + probs[..., s + j, None] * v[:, :, None]
        return self.project_out(out.reshape(b, nh, t, hd))

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        """o_proj of per-head outputs [B,nh,T,hd] -> [B,T,H]."""
        b, nh, t, hd = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, nh * hd))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """SGLang's `midlayer`: norms, 2H-input attention, MLP."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)

    def attention_input(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        # Order matters for weight compatibility: embedding half first.
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = hidden + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))


class DraftCache:
    """Rotated keys and values of the positions the draft has seen, [B,nkv,S,hd].

    `truncate(n)` rolls back to the first n positions (after rejected tokens).
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=2)
        return self.keys, self.values

    def truncate(self, n: int) -> None:
        if not 0 <= n <= len(self):
            raise ValueError(f"DraftCache.truncate({n}) outside 0..{len(self)}")
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :n], self.values[:, :, :n]


class Eagle3Draft(nn.Module):
    """The EAGLE-3 draft. Build it with `eagle3.draft.build_draft` (fresh) or
    `Eagle3Draft.from_state_dict` (checkpoint/export, keeps their d2t)."""

    def __init__(self, cfg: DraftConfig, embed_weight: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor):
        super().__init__()
        h, v, vd = cfg.hidden_size, cfg.vocab_size, cfg.draft_vocab_size
        if tuple(embed_weight.shape) != (v, h):
            raise InputError(f"target embedding has shape {tuple(embed_weight.shape)}, the draft config needs [{v}, {h}]")
        if tuple(d2t.shape) != (vd,) or tuple(t2d.shape) != (v,):
            raise InputError(
                f"vocab map shapes d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} do not match "
                f"draft_vocab_size={vd} / vocab_size={v}; rebuild the vocab map with --draft-vocab-size {vd}"
            )
        self.config = cfg
        self.fc = nn.Linear(3 * h, h, bias=False)
        if cfg.fc_norm:  # EAGLE 3.1: one RMSNorm per aux block (vLLM's fc_norm.{i})
            self.fc_norm = nn.ModuleList(RMSNorm(h, cfg.rms_norm_eps) for _ in range(3))
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, vd, bias=False)
        if cfg.parallel_drafting:  # P-EAGLE: the aux stand-in of slots 1..k-1 (vLLM's `mask_hidden`, [3H])
            self.mask_hidden = nn.Parameter(torch.ones(3 * h))
        # Frozen and never saved: serving reuses the target's embedding.
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("d2t", d2t.detach().to(torch.int64).clone())
        self.register_buffer("t2d", t2d.detach().to(torch.bool).clone())
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    @classmethod
    def from_state_dict(cls, cfg: DraftConfig, state: dict[str, torch.Tensor],
                        embed_weight: torch.Tensor) -> "Eagle3Draft":
        """Rebuild from saved weights. d2t/t2d come from ``state``, never
        re-derived: an lm_head's rows only mean something under its own map."""
        missing = [k for k in ("d2t", "t2d") if k not in state]
        if missing:
            raise InputError(f"draft weights lack {missing}; a checkpoint must carry its vocab map")
        model = cls(cfg, embed_weight, state["d2t"], state["t2d"])
        model.load_state_dict_strict(state)
        return model

    def load_state_dict_strict(self, state: dict[str, torch.Tensor]) -> None:
        """load_state_dict with errors that list the missing/unexpected names."""
        want = set(self.state_dict())
        missing, unexpected = sorted(want - set(state)), sorted(set(state) - want)
        if missing or unexpected:
            raise InputError(f"draft weights do not match the model: missing {missing}, unexpected {unexpected}")
        self.load_state_dict({k: v for k, v in state.items()}, strict=True)

    # -- pieces shared by decoding and TTT ---------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_weight).to(self.fc.weight.dtype)

    def project_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """fc: target aux [.., 3H] -> draft hidden [.., H] (3.1: each H block RMS-normed first)."""
        aux = aux.to(self.fc.weight.dtype)
        if self.config.fc_norm:
            aux = torch.cat([norm(block) for norm, block in zip(self.fc_norm, aux.chunk(3, dim=-1))], dim=-1)
        return self.fc(aux)

    def compute_logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits [.., Vd] from a step's output hidden."""
        return self.lm_head(self.norm(hidden_out))

    def head(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [.., Vd], the hidden the next step is fed): ``out`` itself, or norm(out) for EAGLE 3.1
        (vLLM's norm_output: the post-norm hidden that the lm_head reads)."""
        normed, hidden = self.head_input(out)
        return self.lm_head(normed), hidden

    def head_input(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the lm_head reads: norm(out), the hidden the next step is fed); see `head`."""
        normed = self.norm(out)
        return normed, (normed if self.config.norm_output else out)

    def mask_inputs(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """P-EAGLE: (input ids [*shape], hidden [*shape, H]) of parallel slots 1..k-1: mask_token_id and
        fc(mask_hidden), as vLLM's proposer builds them (combine_hidden_states of mask_hidden)."""
        ids = torch.full(shape, self.config.mask_token_id, dtype=torch.long, device=self.fc.weight.device)
        return ids, self.project_aux(self.mask_hidden).expand(*shape, -1)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids to target ids (target_id = i + d2t[i])."""
        return draft_ids + self.d2t[draft_ids]

    def _hidden_in(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.config.hidden_size
        if hidden.shape[-1] == 3 * h:
            return self.project_aux(hidden)
        if hidden.shape[-1] != h:
            raise ValueError(f"hidden must be [.., {h}] or aux [.., {3 * h}], got {tuple(hidden.shape)}")
        return hidden.to(self.fc.weight.dtype)

    # -- decoding -------------------------------------------------------------

    def step(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
             cache: DraftCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal forward over T new positions, appending to ``cache``.

        input_ids [B,T]; hidden [B,T,3H] (target aux, projected by fc) or
        [B,T,H] (a previous step's hidden_out); position_ids [B,T].
        The new rows attend every cached position and causally each other.
        Returns (draft logits [B,T,Vd], the next step's hidden [B,T,H]: see `head`).
        """
        hidden = self._hidden_in(hidden)
        layer = self.midlayer
        cos, sin = rope_cos_sin(self.inv_freq, position_ids)
        q, k, v = layer.self_attn.qkv(layer.attention_input(self.embed(input_ids), hidden), cos, sin)
        keys, values = cache.append(k, v) if cache is not None else (k, v)
        t, s = q.shape[2], keys.shape[2]
        rows = torch.arange(t, device=q.device)[:, None] + (s - t)
        cols = torch.arange(s, device=q.device)[None, :]
        mask = cols <= rows
        if self.config.sliding_window:  # the last sliding_window positions, as training saw them
            mask &= cols > rows - self.config.sliding_window
        mask = mask[None, None]
        out = layer.finish(hidden, layer.self_attn.attend(q, keys, values, mask))
        return self.head(out)

    def propose_parallel(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                         k: int, cache: DraftCache) -> torch.Tensor:
        """P-EAGLE decoding: append the T new real positions (as `step`) and k-1 mask slots after them in
        one forward; return the draft-vocab logits [B,k,Vd] of the k proposals (the last real row's, then each
        slot's). The slots' cache rows are the caller's to truncate (they hold no real token)."""
        if not self.config.parallel_drafting:
            raise ValueError("propose_parallel needs a parallel_drafting (P-EAGLE) draft")
        b = input_ids.shape[0]
        mask_ids, mask_hidden = self.mask_inputs((b, k - 1))
        last = position_ids[:, -1:]
        positions = torch.cat([position_ids, last + torch.arange(1, k, device=last.device)], dim=1)
        logits, _ = self.step(torch.cat([input_ids, mask_ids], dim=1),
                              torch.cat([self._hidden_in(hidden), mask_hidden], dim=1), positions, cache)
        return logits[:, -k:]

    # -- training-time test --------------------------------------------------

    def ttt_step(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                 history: list[tuple[torch.Tensor, torch.Tensor]], mask0: torch.Tensor | None = None,
                 *, starts: torch.Tensor | None = None, shard=None, q_pos: torch.Tensor | None = None,
                 logits: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One TTT step over whole sequences (see eagle3/draft/ttt.py).

        ``history`` holds (k, v) of earlier steps and gets this step's appended.
        Step 0's keys are attended causally within each sample, every later
        step's keys only at the query's own position. Give exactly one of
        ``starts`` [B,T] (`attention.sample_starts`: the blockwise attention,
        O(T) memory) or ``mask0`` [B,1,T,T] (`ttt.step0_mask`: the dense
        reference, O(T^2)). ``shard`` (eagle3/draft/sequence.py, blockwise only): the rows
        are this rank's slice; step 0's keys are gathered from every rank into ``history``. ``q_pos``
        [B,N] (blockwise, a later step): the rows are the positions q_pos of step 0's keys, gathered
        (eagle3/draft/ttt.py "Sparse steps"); ``starts`` and the diagonal keys are then per gathered row.
        Returns (logits [B,T,Vd], the next step's hidden [B,T,H]: see `head`); with ``logits=False``, what
        the lm_head would read instead of the logits (`head_input`: the fused loss of eagle3/draft/loss.py).
        """
        if (mask0 is None) == (starts is None):
            raise ValueError("ttt_step needs exactly one of mask0 (dense) or starts (blockwise)")
        hidden = self._hidden_in(hidden)
        layer = self.midlayer
        attn_mod = layer.self_attn
        cos, sin = rope_cos_sin(self.inv_freq, position_ids)
        q, k, v = attn_mod.qkv(layer.attention_input(self.embed(input_ids), hidden), cos, sin)
        if shard is not None and not history:  # step 0: every rank's keys, once per micro-batch
            if mask0 is not None:
                raise ValueError("sequence parallelism needs the blockwise attention (starts), not mask0")
            k, v = shard.gather(k), shard.gather(v)
        history.append((k, v))
        (k0, v0), later = history[0], history[1:]
        later_k, later_v = [kv[0] for kv in later], [kv[1] for kv in later]
        if mask0 is not None:
            attn = attn_mod.attend(q, k0, v0, mask0, later_k, later_v)
        else:
            attn = attn_mod.project_out(ttt_attention(q, k0, v0, starts, later_k, later_v,
                                                      q_offset=shard.start if shard is not None else 0,
                                                      q_pos=q_pos))
        out = layer.finish(hidden, attn)
        return self.head(out) if logits else self.head_input(out)
