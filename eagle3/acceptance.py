"""Acceptance arithmetic over verification traces (torch-free).

A trace is a list of `StepRecord`-like objects with ``drafted`` (k_i),
``accepted`` (a_i) and ``emitted`` (a_i + 1: the project decoder and vLLM both count a verification's
accepted drafts before a stop, eos or max_new_tokens, trims the output).

- τ (acceptance length) = Σ emitted / number of verifications. The bonus token
  is included, so a k-step chain caps it at k + 1. The prefill's first token is
  no verification and is left out (SGLang's Σ completion_tokens / Σ
  spec_verify_ct counts it, so its τ reads slightly higher on short outputs).
- acceptance rate at draft position i (1-based) = P(position i accepted |
  position i reached) = #{a ≥ i, k ≥ i} / #{a ≥ i-1, k ≥ i}.
"""

from __future__ import annotations

from typing import Any, Iterable


def _fields(step: Any) -> tuple[int, int, int]:
    if isinstance(step, dict):
        return int(step["drafted"]), int(step["accepted"]), int(step["emitted"])
    return int(step.drafted), int(step.accepted), int(step.emitted)


def acceptance_length(steps: Iterable[Any]) -> float:
    """τ: tokens emitted per target verification (bonus included); 0.0 for no steps."""
    rows = [_fields(s) for s in steps]
    return sum(e for _, _, e in rows) / len(rows) if rows else 0.0


def accept_rate_by_position(steps: Iterable[Any], max_steps: int) -> list[float | None]:
    """[P(pos 1 accepted | reached), ..., P(pos k accepted | reached)]; None where never reached."""
    rows = [_fields(s) for s in steps]
    rates: list[float | None] = []
    for i in range(1, max_steps + 1):
        reached = [a for k, a, _ in rows if k >= i and a >= i - 1]
        rates.append(sum(a >= i for a in reached) / len(reached) if reached else None)
    return rates


def accept_length_histogram(steps: Iterable[Any], max_steps: int) -> list[int]:
    """counts[a] = verifications that accepted exactly a draft tokens, a = 0..max_steps."""
    counts = [0] * (max_steps + 1)
    for _, a, _ in (_fields(s) for s in steps):
        counts[min(a, max_steps)] += 1
    return counts


def simulated_acceptance_length(acc: list[float]) -> float:
    """The trainer's offline estimate 1 + Σ_k Π_{j≤k} acc_j (DESIGN.md), from per-step accuracies."""
    total, prod = 1.0, 1.0
    for a in acc:
        prod *= a
        total += prod
    return total


def ordered_sets(report: dict) -> list[tuple[str, dict]]:
    """(name, summary) of each prompt set of an evaluate report.json, headline set first.

    JSON files are written with sorted keys, so the order lives in ``set_order``; a
    report from before prompt sets existed is one set named by its prompts_source.
    """
    sets = report.get("sets")
    if not sets:
        return [(str(report.get("prompts_source")), report)]
    order = [n for n in report.get("set_order") or [] if n in sets]
    return [(n, sets[n]) for n in order + sorted(set(sets) - set(order))]


def vocab_reach(answers: Iterable[Iterable[int]], draft_vocab: set[int] | frozenset[int]) -> dict:
    """How much of the target's answers the draft vocab can propose: ``tokens`` (answer tokens in all),
    ``outside`` (those not in ``draft_vocab``, the target ids of the draft's Vd tokens) and ``share_outside``.
    A token outside the draft vocab rejects every chain that reaches it, so it caps τ whatever the draft learnt."""
    tokens = outside = 0
    for answer in answers:
        for t in answer:
            tokens += 1
            outside += int(t) not in draft_vocab
    return {"tokens": tokens, "outside": outside, "share_outside": outside / tokens if tokens else 0.0,
            "draft_vocab_size": len(draft_vocab)}


# -- per-prompt counts, intervals, and agreement between two decoders -----------------------------------------
# One record per prompt: {"verifications", "emitted", "reached": [r_1..r_k], "accepted": [a_1..a_k]}. Any engine's
# figures reduce to it (the project decoder from its trace, vLLM from its per-request counter deltas), so τ and the
# per-position rates of two engines are computed, and compared, the same way.

def prompt_counts(steps: Iterable[Any], max_steps: int) -> dict:
    """The per-prompt record of one decode's verification trace."""
    rows = [_fields(s) for s in steps]
    return {"verifications": len(rows), "emitted": sum(e for _, _, e in rows),
            "reached": [sum(1 for k, a, _ in rows if k >= i and a >= i - 1) for i in range(1, max_steps + 1)],
            "accepted": [sum(1 for k, a, _ in rows if k >= i and a >= i) for i in range(1, max_steps + 1)]}


def tau_of(counts: list[dict]) -> float:
    """τ over prompts: Σ emitted / Σ verifications (0.0 without verifications)."""
    v = sum(c["verifications"] for c in counts)
    return sum(c["emitted"] for c in counts) / v if v else 0.0


def rates_of(counts: list[dict]) -> list[float | None]:
    """P(position i accepted | reached) over prompts, i = 1..k."""
    k = max((len(c["reached"]) for c in counts), default=0)
    out: list[float | None] = []
    for i in range(k):
        reached = sum(c["reached"][i] for c in counts if i < len(c["reached"]))
        out.append(sum(c["accepted"][i] for c in counts if i < len(c["accepted"])) / reached if reached else None)
    return out


def _stats(counts: list[dict]) -> list[float | None]:
    return [tau_of(counts), *rates_of(counts)]


def bootstrap_intervals(counts: list[dict], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """τ and each position's rate with a percentile bootstrap interval over prompts (resampled with replacement)."""
    import random

    rng = random.Random(seed)
    n = len(counts)
    draws = [_stats([counts[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples)] if n else []
    point = _stats(counts)

    def interval(j: int) -> list[float] | None:
        values = sorted(d[j] for d in draws if d[j] is not None)
        if not values:
            return None
        lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
        return [values[int(lo * (len(values) - 1))], values[int(hi * (len(values) - 1))]]

    return {"prompts": n, "level": level, "tau": point[0], "tau_interval": interval(0),
            "accept_rate_by_position": point[1:], "rate_intervals": [interval(j) for j in range(1, len(point))]}


def paired_agreement(a: list[dict], b: list[dict], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """Do two decoders reach the same acceptance on the same prompts? The prompts are resampled together (a paired
    bootstrap of τ_a - τ_b and of each position's rate difference); a difference whose interval excludes 0 is a
    disagreement larger than the prompts allow, the sign of a convention mismatch between the engines (aux layers,
    d2t, norms, rotary) rather than noise."""
    import random

    if len(a) != len(b):
        raise ValueError(f"paired agreement needs the same prompts: {len(a)} vs {len(b)} records")
    rng = random.Random(seed)
    n = len(a)
    diffs = []
    for _ in range(resamples if n else 0):
        idx = [rng.randrange(n) for _ in range(n)]
        sa, sb = _stats([a[i] for i in idx]), _stats([b[i] for i in idx])
        diffs.append([x - y if x is not None and y is not None else None for x, y in zip(sa, sb)])
    pa, pb = _stats(a), _stats(b)
    point = [x - y if x is not None and y is not None else None for x, y in zip(pa, pb)]
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    out = []
    for j, d in enumerate(point):
        values = sorted(x[j] for x in diffs if j < len(x) and x[j] is not None)
        iv = [values[int(lo_q * (len(values) - 1))], values[int(hi_q * (len(values) - 1))]] if values else None
        out.append({"difference": d, "interval": iv, "agree": iv is None or iv[0] <= 0 <= iv[1]})
    return {"prompts": n, "level": level, "tau": out[0], "by_position": out[1:],
            "agree": all(x["agree"] for x in out)}
