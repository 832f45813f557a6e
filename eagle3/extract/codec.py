"""Encode and decode the per-token tensors of each storage option.

Which tensors an option stores, their dtypes and bytes per token are owned by
:mod:`eagle3.storage_options`; this module turns the target's features into
exactly those tensors and back. fp8 scales are per token and aux layer:
``aux[:, k*H:(k+1)*H] ≈ aux_q.float() * aux_scale[:, k:k+1]``. ``topk_logprobs``
are the log-softmax over the FULL vocab, best first, not renormalized (the rest of
the distribution is not kept).

The target side comes to :func:`encode` either as ``last`` (the final-norm state; top-k
log-probs are then computed here through the lm_head) or, from an engine that returns the
distribution itself (the sglang engine), as :class:`TopK`: the same K best log-probs, which
must be normalised over the full vocab as log_softmax does; they are stored as they come.

The reader decodes: ``aux`` always comes back as a float tensor [T, 3H]; the
target side comes back as ``last`` [T, H] (``bf16``/``fp8``) or as ``topk_ids``
+ ``topk_logprobs`` (``fp8-topk``). :func:`target_logprobs` turns either into
log-probs over the target vocab, so a trainer need not know the option.
"""

from __future__ import annotations

import torch

from dataclasses import dataclass

from eagle3.storage_options import NUM_AUX, TOPK, option

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
_LOGIT_ROWS = 1024  # rows of [rows, V] logits computed at once for top-k


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row fp8: x [T, D] -> (q fp8 [T, D], scale bf16 [T, 1]) with x ≈ q * scale."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    # Round the scale to bf16 first so that dequantizing uses exactly the
    # stored scale; clamp because bf16 rounding may push |x/scale| above 448
    # and an out-of-range cast to e4m3fn gives NaN.
    scale = (amax / FP8_MAX).to(torch.bfloat16)
    q = (x / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def _quantize_groups(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    t, d = x.shape
    q, scale = _quantize(x.reshape(t * groups, d // groups))
    return q.reshape(t, d), scale.reshape(t, groups)


@dataclass(frozen=True)
class TopK:
    """The target's K best next-token log-probs per token, ready-made by the engine: ``ids`` [T, K] (target
    vocab ids) and ``logprobs`` [T, K] (log-softmax over the full vocab, best first). What ``fp8-topk``
    stores, in place of ``last``."""

    ids: torch.Tensor
    logprobs: torch.Tensor


def encode(storage_option: str, aux: torch.Tensor, last, lm_head=None, topk: int = TOPK) -> dict:
    """Per-token features of real (non-padding) tokens -> CPU tensors of one option.

    aux: [T, 3H] float (any device); last: [T, H] final-norm hidden state, or a :class:`TopK` (fp8-topk only);
    lm_head: callable [T, H] -> [T, V] logits, needed by ``fp8-topk`` from ``last`` only.
    """
    option(storage_option)
    if isinstance(last, TopK) and storage_option != "fp8-topk":
        raise ValueError(f"storage option {storage_option!r} stores the final-norm state `last`; an engine that "
                         "returns top-k log-probs instead (TopK) fills fp8-topk stores only")
    n_aux = NUM_AUX
    if storage_option == "bf16":
        return {"aux": aux.to(torch.bfloat16).cpu(), "last": last.to(torch.bfloat16).cpu()}
    aux_q, aux_scale = _quantize_groups(aux, n_aux)
    out = {"aux": aux_q.cpu(), "aux_scale": aux_scale.cpu()}
    if storage_option == "fp8":
        last_q, last_scale = _quantize(last)
        out.update(last=last_q.cpu(), last_scale=last_scale.cpu())
        return out
    if isinstance(last, TopK):
        if tuple(last.ids.shape) != (aux.shape[0], topk) or last.logprobs.shape != last.ids.shape:
            raise ValueError(f"top-k of shape {list(last.ids.shape)} / {list(last.logprobs.shape)} for "
                             f"{aux.shape[0]} tokens; fp8-topk stores [tokens, {topk}]")
        out.update(topk_ids=last.ids.to(torch.int32).cpu(), topk_logprobs=last.logprobs.to(torch.float16).cpu())
        return out
    if lm_head is None:
        raise ValueError("storage option 'fp8-topk' needs the target's lm_head to compute top-k log-probs")
    # Logits of a whole batch ([T, V] fp32) can take gigabytes: go in row chunks.
    ids, values = [], []
    for rows in last.split(_LOGIT_ROWS):
        logprobs = torch.log_softmax(lm_head(rows).float(), dim=-1)
        v, i = logprobs.topk(topk, dim=-1)
        ids.append(i.to(torch.int32).cpu())
        values.append(v.to(torch.float16).cpu())
    out.update(topk_ids=torch.cat(ids), topk_logprobs=torch.cat(values))
    return out


def decode(storage_option: str, tensors: dict) -> dict:
    """Stored per-token tensors of one sample -> what the reader returns."""
    if storage_option == "bf16":
        return {"aux": tensors["aux"], "last": tensors["last"]}
    aux_q, aux_scale = tensors["aux"], tensors["aux_scale"]
    t, d = aux_q.shape
    groups = aux_scale.shape[-1]
    aux = (aux_q.float().reshape(t, groups, d // groups) * aux_scale.float().unsqueeze(-1)).reshape(t, d)
    if storage_option == "fp8":
        return {"aux": aux, "last": tensors["last"].float() * tensors["last_scale"].float()}
    return {"aux": aux, "topk_ids": tensors["topk_ids"], "topk_logprobs": tensors["topk_logprobs"]}


def target_logprobs(sample: dict, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """The target's next-token log-probs [T, V] (fp32) for a sample from the store.

    With ``last`` in the sample: log_softmax(last @ lm_head_weight.T) (``last``
    is already final-normed). With ``topk_ids``/``topk_logprobs``: the top-K
    entries renormalized to sum to 1, every other token -inf (probability 0).
    Row t predicts token t+1, as in the contract's alignment section.
    """
    w = lm_head_weight
    if "last" in sample:
        with torch.autocast(device_type=w.device.type, enabled=False):  # fp32 even inside a bf16 autocast region
            return torch.log_softmax(sample["last"].to(w.device).float() @ w.float().T, dim=-1)
    ids = sample["topk_ids"].to(w.device).long()
    lp = sample["topk_logprobs"].to(w.device).float()
    lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    out = torch.full((ids.shape[0], w.shape[0]), float("-inf"), device=w.device)
    return out.scatter_(1, ids, lp)
