"""Storage options of the hidden-state store: how per-token features become shard tensors.

Every option stores, per token, the target's aux features (the outputs of the
aux layers, concatenated, [T, 3H]) and something from which the target's
next-token distribution can be rebuilt. Per-token bytes (H = hidden size,
ids/mask add 5 more bytes, offsets 8 bytes per sample):

``bf16`` (baseline, 8H bytes)
    ``aux`` bf16 [T, 3H]; ``last`` bf16 [T, H] = the final-norm hidden state
    (what feeds lm_head).
``fp8`` (4H + 8 bytes)
    ``aux`` float8_e4m3fn [T, 3H] with ``aux_scale`` bf16 [T, 3] (one scale per
    token and aux layer: aux[:, k*H:(k+1)*H] ≈ aux_q.float() * aux_scale[:, k:k+1]);
    ``last`` float8_e4m3fn [T, H] with ``last_scale`` bf16 [T, 1].
``fp8-topk`` (3H + 6 + 6K bytes, K = 16 → 3H + 102)
    ``aux`` as in ``fp8``; instead of ``last`` the target's top-K next-token
    log-probs: ``topk_ids`` int32 [T, K] (target vocab ids, best first) and
    ``topk_logprobs`` float16 [T, K] (log-softmax over the FULL vocab, not
    renormalized). The rest of the distribution (≈ 1 - Σ exp(topk_logprobs)) is
    not kept.

The reader decodes: ``aux`` always comes back as a float tensor [T, 3H]; the
target side comes back as ``last`` [T, H] (``bf16``/``fp8``) or as ``topk_ids``
+ ``topk_logprobs`` (``fp8-topk``). :func:`target_logprobs` turns either into
log-probs over the target vocab, so a trainer need not know the option.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
TOPK = 16
_LOGIT_ROWS = 1024  # rows of [rows, V] logits computed at once for top-k

#: option name -> what it stores for the target distribution
OPTIONS = {
    "bf16": "last",
    "fp8": "last",
    "fp8-topk": "topk",
}


def check_option(storage: str) -> str:
    from eagle3.errors import InputError

    if storage not in OPTIONS:
        raise InputError(f"unknown storage option {storage!r}; use one of: {', '.join(OPTIONS)}")
    return storage


def bytes_per_token(storage: str, hidden_size: int, topk: int = TOPK) -> int:
    """Stored bytes per token for the features, plus 4 (input_ids int32) + 1 (loss_mask)."""
    h = hidden_size
    feats = {
        "bf16": 8 * h,
        "fp8": 3 * h + 6 + h + 2,
        "fp8-topk": 3 * h + 6 + topk * (4 + 2),
    }[check_option(storage)]
    return feats + 5


def needs_lm_head(storage: str) -> bool:
    return OPTIONS[check_option(storage)] == "topk"


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


def encode(storage: str, aux: torch.Tensor, last: torch.Tensor, lm_head=None, topk: int = TOPK) -> dict:
    """Per-token features of real (non-padding) tokens -> CPU tensors of one option.

    aux: [T, 3H] float (any device); last: [T, H] final-norm hidden state;
    lm_head: callable [T, H] -> [T, V] logits, needed by ``fp8-topk`` only.
    """
    check_option(storage)
    n_aux = aux.shape[-1] // last.shape[-1]
    if storage == "bf16":
        return {"aux": aux.to(torch.bfloat16).cpu(), "last": last.to(torch.bfloat16).cpu()}
    aux_q, aux_scale = _quantize_groups(aux, n_aux)
    out = {"aux": aux_q.cpu(), "aux_scale": aux_scale.cpu()}
    if storage == "fp8":
        last_q, last_scale = _quantize(last)
        out.update(last=last_q.cpu(), last_scale=last_scale.cpu())
        return out
    if lm_head is None:
        raise ValueError("storage 'fp8-topk' needs the target's lm_head to compute top-k log-probs")
    # Logits of a whole batch ([T, V] fp32) can take gigabytes: go in row chunks.
    ids, values = [], []
    for rows in last.split(_LOGIT_ROWS):
        logprobs = torch.log_softmax(lm_head(rows).float(), dim=-1)
        v, i = logprobs.topk(topk, dim=-1)
        ids.append(i.to(torch.int32).cpu())
        values.append(v.to(torch.float16).cpu())
    out.update(topk_ids=torch.cat(ids), topk_logprobs=torch.cat(values))
    return out


def decode(storage: str, tensors: dict) -> dict:
    """Stored per-token tensors of one sample -> what the reader returns."""
    if storage == "bf16":
        return {"aux": tensors["aux"], "last": tensors["last"]}
    aux_q, aux_scale = tensors["aux"], tensors["aux_scale"]
    t, d = aux_q.shape
    groups = aux_scale.shape[-1]
    aux = (aux_q.float().reshape(t, groups, d // groups) * aux_scale.float().unsqueeze(-1)).reshape(t, d)
    if storage == "fp8":
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
