"""What `eagle3 evaluate` prints before its JSON summary: τ, speedup and the lossless verdict per engine."""

from __future__ import annotations

from eagle3.evaluate.config import EvaluateConfig
from eagle3.report.summary import vocab_reach_text


def say(cfg: EvaluateConfig, summary: dict) -> str:
    lines = [f"{cfg.backend}: tau {summary['acceptance_length']:.3f} (k={cfg.steps}), speedup "
             f"x{summary['speedup']:.2f} ({summary['tokens_per_s_spec']:.1f} vs {summary['tokens_per_s_base']:.1f} "
             f"tok/s), lossless={summary['lossless']}"]
    if summary.get("proposer", "draft") != "draft":
        by = summary["proposed_by"]
        lines.append(f"proposer {summary['proposer']}: " + ", ".join(
            f"{name} {n['accepted']}/{n['proposed']} accepted" for name, n in by.items()))
    if reach := vocab_reach_text(summary):
        lines.append(reach)
    for name in cfg.compare_with:
        e, a = summary["engines"][name], summary["agreement"][name]
        lines.append(f"{name}: tau {e['tau']:.3f} {e['tau_interval']}, speedup x{e['speedup']:.2f}, "
                     f"lossless={e['lossless']}; {'agrees' if a['agree'] else 'DISAGREES'} with {cfg.backend} "
                     "within the intervals")
    return "\n".join(lines)
