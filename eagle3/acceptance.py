"""Acceptance arithmetic over verification traces (torch-free).

A trace is a list of `StepRecord`-like objects with ``drafted`` (k_i),
``accepted`` (a_i) and ``emitted`` (tokens appended, normally a_i + 1).

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
