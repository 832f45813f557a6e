"""The lossless gate of the evaluate stage: greedy speculation must reproduce the baseline token for token."""

from __future__ import annotations

from eagle3.errors import GateFailed


def mismatches(report: dict) -> list[str]:
    """One line per prompt whose speculative tokens differ from the baseline's in this engine's report."""
    lines = []
    for row in report["prompts"]:
        if row["lossless"]:
            continue
        m = row.get("mismatch") or {}
        at = m.get("position", row.get("first_difference"))
        detail = (f" (baseline token {m['baseline_token']}, speculative token {m['speculative_token']})"
                  if "baseline_token" in m else "")
        lines.append(f"  prompt {row['id']}: first difference at generated position {at}{detail}")
    return lines


def gate(reports: dict[str, dict], where: str) -> None:
    """GateFailed naming each engine and prompt that was not lossless."""
    parts = []
    for name, report in reports.items():
        bad = mismatches(report)
        if bad:
            parts.append(f"{name}: speculative output differs from the baseline on {len(bad)} prompt(s):")
            parts += bad[:20]
            if report["precision"]["name"] != "float32" or report["device"] != "cpu":
                parts.append(f"  In {report['precision']['name']} on {report['device']}, a near-tie can flip an "
                             "argmax between a 1-token and a (k+1)-token forward; rerun with --device cpu "
                             "--precision float32 to tell a decoder bug from numerical noise.")
    if parts:
        raise GateFailed("\n".join(parts) + f"\n(report: {where})")
