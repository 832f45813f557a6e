"""The lossless verdict: what a difference between the baseline and the speculative output means.

Greedy speculation emits the target's argmax at every position, so in exact arithmetic its output equals
plain greedy decoding token for token. In bf16 the two runs compute a position's logits in different
shapes (a 1-token forward against a (k+1)-token verification), each with its own rounding, and a near-tie
between the top two tokens can flip. That is numerical noise, not a decoder bug, and the output after it
follows another (equally greedy) path. So every divergence is classified at its first differing position:

1. the prefix (prompt + the common output before it) is re-scored by the target in fp32 and once more in
   the engine's precision;
2. the precision's rounding at that prefix is measured, not assumed: ``noise`` is the spread of
   (low-precision logit - fp32 logit) over the fp32 top tokens and both candidates (a common offset
   does not move an argmax, so the spread is what can reorder two tokens). That is one fresh forward; the
   two decodes are incremental (a bf16 KV cache, 1-token and (k+1)-token shapes) and carry more: the demo's
   run on this machine had a baseline step 0.23 off a margin where the fresh forward's spread was 0.09.
   So each run is allowed twice the measured spread, and two runs can swap tokens whose fp32 margin is
   within ``RUNS_NOISE * noise``, never less than two units of rounding of the candidates' logits;
3. a *tie flip* is a divergence whose two candidates are both within that tolerance of the fp32 maximum:
   counted, listed with its margin, not a failure. Any other divergence (a wrong draft token accepted, an
   off-by-one in the accepted count, a cache not rolled back) fails the gate: such a token is not a
   near-tie of the target's choice;
4. after a tie flip the speculative output follows another greedy path, and that path is checked too: one
   teacher-forced forward over it (fp32 and the engine's precision) must find every later speculative token
   the target's choice at its prefix, or a tie of it. So a bug that shows late in a decode (a cache crop,
   a window boundary) is not hidden by an early flip.

In fp32 the measured noise is ~0 and the floor is 2^-16 relative: not fp32's 2^-23 rounding unit but what the
shape of a forward moves an fp32 logit by (SmolLM2, a 1-token against a 4-token chunked forward over the same
tokens: median 4.6e-5, at most 1.2e-4, at |logit| up to ~20; 2^-16 x 20 x 2 = 6e-4). So only a near-exact tie
passes in fp32: the check means the same thing in every precision. The verdict prints as "exact", "exact up to N
tie flips (bf16)" or "FAILED" (``verdict``).
"""

from __future__ import annotations

from typing import Callable, Sequence

UNIT = {"float32": 2.0 ** -16, "bfloat16": 2.0 ** -8}
"""How far one run's rounding can move a logit, relative to its magnitude: bf16's spacing of representable values
(7 bits of mantissa); for fp32 the measured spread between forward shapes, not its 2^-23 spacing (docstring)."""
SHORT = {"float32": "fp32", "bfloat16": "bf16"}
TOP = 8
"""fp32 top tokens over which the rounding noise is measured."""
RUNS_NOISE = 4.0
"""Two runs, each allowed twice the rounding spread one fresh forward measures at that prefix."""


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two outputs differ (a length difference counts at the shorter's end)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def mismatch(base: Sequence[int], spec: Sequence[int]) -> dict | None:
    """Where and how the speculative output leaves the baseline's; None when they are equal."""
    at = first_difference(base, spec)
    if at is None:
        return None
    return {"position": at, "baseline_token": base[at] if at < len(base) else None,
            "speculative_token": spec[at] if at < len(spec) else None}


def classify(logits32, logits_low, a: int, b: int, precision: str) -> dict:
    """Whether tokens ``a`` (baseline) and ``b`` (speculative) are a tie at one prefix.

    ``logits32``/``logits_low``: the target's next-token logits [V] at that prefix in fp32 and in the engine's
    precision. Returns the figures the report lists: both margins (a's logit minus b's), the tolerance, the
    measured noise and the fp32 argmax."""
    import torch

    l32, low = logits32.float(), logits_low.float()
    top = torch.topk(l32, min(TOP, l32.numel())).indices.tolist()
    ids = torch.tensor(sorted({*top, a, b}))
    err = (low[ids] - l32[ids])
    noise = float(err.max() - err.min())
    floor = 2 * UNIT.get(precision, UNIT["bfloat16"]) * max(abs(float(l32[a])), abs(float(l32[b])), 1.0)
    tolerance = max(RUNS_NOISE * noise, floor)
    margin = float(l32[a] - l32[b])
    # Each run took its precision's argmax, so both tokens lie near the fp32 maximum, not only near each other.
    below = float(l32.max()) - min(float(l32[a]), float(l32[b]))
    return {"baseline_token": a, "speculative_token": b, "margin_fp32": margin,
            "margin_low": float(low[a] - low[b]), "noise": noise, "tolerance": tolerance,
            "fp32_argmax": int(l32.argmax()), "below_fp32_max": below,
            "tie": abs(margin) <= tolerance and below <= tolerance}


Rescore = Callable[..., tuple["object", "object"]]
"""(prefix token ids, positions=1) -> (fp32 logits, low-precision logits) of the next token after each of the
prefix's last ``positions`` tokens: [V] each for one position, [positions, V] for more."""


def judge(row: dict, prompt_ids: Sequence[int], base: Sequence[int], spec: Sequence[int], precision: str,
          rescore: Rescore) -> dict:
    """Fill one prompt row's verdict: ``exact``, ``mismatch``, ``tie_flip`` (the figures) and ``lossless``
    (exact or a tie flip); ``rescore`` runs only when the outputs differ."""
    m = mismatch(base, spec)
    row["exact"] = m is None
    if m is None:
        row["lossless"] = True
        return row
    row["mismatch"] = m
    a, b = m["baseline_token"], m["speculative_token"]
    if a is None or b is None:  # one output stopped where the other went on: not a choice between two tokens
        row["lossless"] = False
        return row
    logits32, low = rescore([*prompt_ids, *spec[:m["position"]]])
    figures = classify(logits32, low, a, b, precision)
    m.update({k: v for k, v in figures.items() if k not in ("baseline_token", "speculative_token")})
    row["lossless"] = bool(figures["tie"])
    if figures["tie"]:
        row["tie_flip"] = {"position": m["position"], **figures}
        _check_after_flip(row, prompt_ids, spec, m["position"], precision, rescore)
    return row


def _check_after_flip(row: dict, prompt_ids: Sequence[int], spec: Sequence[int], flip: int, precision: str,
                      rescore: Rescore) -> None:
    """Every speculative token after a tie flip is the target's choice at its own prefix, or a tie of it (one
    teacher-forced forward over the speculative output); the first that is not makes the row a failure."""
    later = len(spec) - 1 - flip
    if later <= 0:
        return
    l32s, lows = rescore([*prompt_ids, *spec[:-1]], positions=later)
    if l32s.dim() == 1:  # one position: [V]
        l32s, lows = l32s[None], lows[None]
    ties = 0
    for i, j in enumerate(range(flip + 1, len(spec))):
        best = int(l32s[i].argmax())
        if spec[j] == best:
            continue
        figures = classify(l32s[i], lows[i], best, spec[j], precision)
        if figures["tie"]:
            ties += 1
            continue
        row["lossless"] = False
        row["mismatch"] = {"position": j, "after_tie_flip_at": flip, "baseline_token": best,
                           "speculative_token": spec[j],
                           **{k: v for k, v in figures.items() if k not in ("baseline_token", "speculative_token")}}
        row.pop("tie_flip")
        return
    row["tie_flip"]["checked_after"] = later
    row["tie_flip"]["ties_after"] = ties


def _text(failed: list, ties: list, precisions: list[str]) -> str:
    if failed:
        return "FAILED"
    if ties:
        names = ", ".join(sorted({SHORT.get(p, p) for p in precisions}))
        return f"exact up to {len(ties)} tie flip{'s' if len(ties) > 1 else ''} ({names})"
    return "exact"


def verdict(rows: list[dict], precision: str) -> dict:
    """The verdict over prompt rows that `judge` filled: text, passed, the tie flips and the failures."""
    ties = [{"set": r.get("set"), "id": r["id"], **r["tie_flip"]} for r in rows if r.get("tie_flip")]
    failed = [{"set": r.get("set"), "id": r["id"], **(r.get("mismatch") or {})} for r in rows if not r["lossless"]]
    return {"text": _text(failed, ties, [precision]), "passed": not failed, "precision": precision, "prompts": len(rows),
            "exact_prompts": sum(bool(r.get("exact", r["lossless"])) for r in rows),
            "tie_flips": ties, "failed": failed}


def combined(verdicts: dict[str, dict]) -> dict:
    """One verdict over several engines' (what report.json's top level says when engines were compared)."""
    ties = [{"engine": name, **t} for name, v in verdicts.items() for t in v["tie_flips"]]
    failed = [{"engine": name, **f} for name, v in verdicts.items() for f in v["failed"]]
    precisions = [v["precision"] for v in verdicts.values()]
    return {"text": _text(failed, ties, precisions), "passed": not failed, "engines": list(verdicts),
            "tie_flips": ties, "failed": failed}


class TargetRescorer:
    """`Rescore` over a transformers target: the fp32 copy is loaded on the first divergence only (an exact run
    never pays for it); ``low`` is the engine's-precision model, or loaded likewise when not given."""

    def __init__(self, target_dir: str, device: str, precision: str, low_model=None):
        self.target_dir, self.device, self.precision = target_dir, device, precision
        self._low = low_model
        self._fp32 = low_model if precision == "float32" and low_model is not None else None

    def _model(self, precision: str):
        from eagle3.target import load_model

        return load_model(self.target_dir, self.device, precision)

    def __call__(self, prefix: list[int], positions: int = 1):
        import torch

        if self._fp32 is None:
            self._fp32 = self._model("float32")
        if self._low is None:
            self._low = self._fp32 if self.precision == "float32" else self._model(self.precision)
        ids = torch.tensor([prefix], device=next(self._fp32.parameters()).device)
        with torch.no_grad():
            l32 = self._fp32(input_ids=ids, logits_to_keep=positions).logits[0].float()
            low = self._low(input_ids=ids.to(next(self._low.parameters()).device),
                            logits_to_keep=positions).logits[0].float()
        if positions == 1:
            return l32[-1].cpu(), low[-1].cpu()
        return l32[-positions:].cpu(), low[-positions:].cpu()
