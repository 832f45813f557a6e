"""The lossless gate of the evaluate stage: greedy speculation must reproduce the baseline token for token, up
to the tie flips that eagle3.evaluate.lossless tells from failures."""

from __future__ import annotations

from eagle3.errors import GateFailed


def mismatches(report: dict) -> list[str]:
    """One line per prompt whose speculative tokens differ from the baseline's in this engine's report, tie flips
    left out (they are listed in the report's ``lossless_verdict``)."""
    lines = []
    for row in report["prompts"]:
        if row["lossless"]:
            continue
        m = row.get("mismatch") or {}
        at = m.get("position", row.get("first_difference"))
        detail = (f" (baseline token {m['baseline_token']}, speculative token {m['speculative_token']})"
                  if "baseline_token" in m else "")
        if "after_tie_flip_at" in m:  # the speculative path after an accepted flip, re-scored teacher-forced
            detail = (f" after a tie flip at {m['after_tie_flip_at']} (the target's choice there "
                      f"{m['baseline_token']}, speculative token {m['speculative_token']})")
        if "margin_fp32" in m:  # re-scored in fp32 (eagle3.evaluate.lossless): not a near-tie
            detail += (f"; fp32 margin {m['margin_fp32']:.4f} is beyond the {m['tolerance']:.4f} that rounding "
                       f"can flip (fp32 argmax {m['fp32_argmax']})")
        what = "not the target's choice at generated position" if "after_tie_flip_at" in m else \
            "first difference at generated position"
        lines.append(f"  prompt {row['id']}: {what} {at}{detail}")
    return lines


def gate(reports: dict[str, dict], where: str) -> None:
    """GateFailed naming each engine and prompt that was not lossless."""
    parts = []
    for name, report in reports.items():
        bad = mismatches(report)
        if bad:
            parts.append(f"{name}: speculative output differs from the baseline on {len(bad)} prompt(s):")
            parts += bad[:20]
            parts.append("  Each difference was re-scored by the target in fp32: a near-tie within the precision's "
                         "rounding counts as a tie flip and passes; these did not (a decoder or draft-loading bug).")
    if parts:
        raise GateFailed("\n".join(parts) + f"\n(report: {where})")
