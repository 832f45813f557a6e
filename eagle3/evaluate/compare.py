"""One draft, several engines, the same prompts: their acceptance side by side in one report.json.

Every backend's report carries one per-prompt record (eagle3.acceptance.prompt_counts shape) per
prompt. For the headline prompt set this adds, per engine, τ and each position's acceptance rate
with a bootstrap interval over prompts, and per other engine a paired bootstrap of the differences
against the primary backend: a difference whose interval excludes 0 is more than the prompts
allow, the sign that the two engines do not run the draft the same way (aux layers, d2t, norms).
"""

from __future__ import annotations

from eagle3 import acceptance
from eagle3.evaluate import lossless


def _headline_counts(report: dict) -> list[tuple[tuple[str, str], dict]]:
    return [((r["set"], r["id"]), r["counts"]) for r in report["prompts"] if r["set"] == report["primary_set"]]


def engine_figures(report: dict) -> dict:
    """τ, per-position rates (with intervals), speed and the lossless verdict of one engine's report."""
    ci = acceptance.bootstrap_intervals([c for _, c in _headline_counts(report)])
    return {**ci, "tokens_per_s_spec": report["tokens_per_s_spec"], "tokens_per_s_base": report["tokens_per_s_base"],
            "speedup": report["speedup"], "lossless": report["lossless"], "precision": report["precision"]["name"],
            **({"lossless_verdict": report["lossless_verdict"]} if "lossless_verdict" in report else {}),
            **({"server_start_s": report["server"]["start_s"]} if "server" in report else {})}


def combine(reports: dict[str, dict], primary: str) -> dict:
    """The primary backend's report with ``engines`` (figures per backend), ``agreement`` (per other
    backend) and ``lossless`` over all engines; the other engines' prompt rows stay in their own files."""
    report = dict(reports[primary])
    report["engines"] = {name: engine_figures(r) for name, r in reports.items()}
    report["engine_order"] = list(reports)
    ours = _headline_counts(reports[primary])
    report["agreement"] = {}
    for name, other in reports.items():
        if name == primary:
            continue
        theirs = dict(_headline_counts(other))
        if [key for key, _ in ours] != [key for key in theirs]:
            raise ValueError(f"{primary} and {name} measured different prompts; they cannot be compared")
        ids = {(r["set"], r["id"]): r.get("token_ids") for r in other["prompts"]}
        same = sum(ids.get((r["set"], r["id"])) == r.get("token_ids") for r in reports[primary]["prompts"]
                   if (r["set"], r["id"]) in ids)
        report["agreement"][name] = {**_agreement(ours, theirs, ids, reports[primary]), "against": primary,
                                     "same_greedy_output": same, "prompts_compared": len(ours)}
    report["lossless"] = all(r["lossless"] for r in reports.values())
    verdicts = {name: r["lossless_verdict"] for name, r in reports.items() if "lossless_verdict" in r}
    if len(verdicts) == len(reports):
        report["lossless_verdict"] = lossless.combined(verdicts)
    return report


def _agreement(ours: list, theirs: dict, their_ids: dict, primary_report: dict) -> dict:
    """The paired agreement over the prompts where both engines emitted the same greedy tokens, when some did not.

    A tie flip (eagle3.evaluate.lossless) sends the two engines down different continuations of a prompt, and
    acceptance on different text is not comparable. A convention mismatch (aux layers, d2t, norms) still shows
    on the prompts they decode alike, since it changes acceptance, never the output. All prompts' figures stay
    under ``all_prompts``."""
    our_ids = {(r["set"], r["id"]): r.get("token_ids") for r in primary_report["prompts"]}
    everything = acceptance.paired_agreement([c for _, c in ours], [theirs[key] for key, _ in ours])
    alike = [(key, c) for key, c in ours if their_ids.get(key) == our_ids.get(key)]
    if not alike or len(alike) == len(ours):
        return {**everything, "compared_on": "all prompts"}
    on_alike = acceptance.paired_agreement([c for _, c in alike], [theirs[key] for key, _ in alike])
    return {**on_alike, "compared_on": f"the {len(alike)} prompts with the same greedy output",
            "all_prompts": everything}


def disagreements(report: dict) -> list[str]:
    """One line per engine whose acceptance differs from the primary's more than the intervals allow."""
    out = []
    for name, a in (report.get("agreement") or {}).items():
        if a["agree"]:
            continue
        where = ["τ"] * (not a["tau"]["agree"]) + [f"position {i + 1}" for i, p in enumerate(a["by_position"])
                                                   if not p["agree"]]
        out.append(f"{name} vs {a['against']}: τ differs by {a['tau']['difference']:+.3f} "
                   f"(interval {a['tau']['interval']}, on {a.get('compared_on', 'all prompts')}); "
                   f"disagreement at {', '.join(where)}")
    return out
