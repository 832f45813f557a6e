"""What a run's summary says, in one place: the report page (report.html), the Airflow UI's report tab and
``make demo`` all print from here, so τ, speedup, their engine and the lossless verdict read the same everywhere.

- ``headline_rows(eval_report)``: one row per engine and prompt set that EVAL/report.json measured, each
  with τ, the acceptance rates, both throughputs and the speedup *of that engine on that set*, and its
  lossless verdict.
- ``lossless_text(d)``: ``lossless_verdict.text`` when evaluate wrote one ("exact", "exact up to N tie flips
  (bf16)", "FAILED"), else "exact"/"FAILED" from the ``lossless`` bool.
- ``tie_flips(eval_report)``: every engine's tie flips with their fp32 margins and tolerances.
- ``vocab_reach_text(eval_report)``: how much of the target's answers, per prompt set, the draft vocab holds.
- ``run_status(task_states, errors)``: which tasks failed (with their first error lines), which did not run
  because of them, which were skipped.
- ``fmt(value)`` / ``fmt_metric(key, value)``: the one number formatter of both pages (they differ in layout
  only).
"""

from __future__ import annotations

import json
import time
from typing import Any

from eagle3.acceptance import ordered_sets

VERDICT_TASK = "outcome"
"""The DAG's last task: it fails when another task failed, so it is the run's verdict, not one more failure."""
ENGINE_LABELS = {"transformers": "project decoder (transformers)", "vllm": "vLLM", "sglang": "SGLang"}


def fmt(value: Any) -> str:
    """Numbers people can read: thousands separators, 4 significant digits for floats; None is "—"."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if value is None:
        return "—"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def fmt_metric(key: str, value: Any) -> str:
    """``fmt``, with Unix times (``time``, ``*_at``) as UTC dates."""
    if (key == "time" or key.endswith("_at")) and isinstance(value, (int, float)) and value > 1e8:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))
    return fmt(value)


def engine_label(name: str | None) -> str:
    return ENGINE_LABELS.get(str(name), str(name))


def lossless_text(d: dict | None) -> str:
    """The lossless verdict of a report, an engine or a prompt set, as printed."""
    d = d or {}
    verdict = d.get("lossless_verdict")
    if isinstance(verdict, dict) and verdict.get("text"):
        return str(verdict["text"])
    if "lossless" not in d and "lossless_prompts" in d and "num_prompts" in d:
        return "exact" if d["lossless_prompts"] == d["num_prompts"] else "FAILED"
    lossless = d.get("lossless")
    return "n/a" if lossless is None else ("exact" if lossless else "FAILED")


def lossless_ok(d: dict | None) -> bool | None:
    """Whether the verdict passes (exact, or exact up to tie flips); None when there is none."""
    text = lossless_text(d)
    return None if text == "n/a" else text != "FAILED"


def headline_rows(ev: dict | None) -> list[dict[str, Any]]:
    """Every (engine, prompt set) figure of an evaluate report.json, the headline (primary engine, first set)
    first. The primary engine measured every set; the engines it was compared with, the first set only."""
    if not ev:
        return []
    primary = ev.get("backend") or (ev.get("engine_order") or ["?"])[0]
    engines = ev.get("engines") or {}
    common = {"steps": ev.get("steps"), "max_new_tokens": ev.get("max_new_tokens")}
    rows = []
    for i, (name, s) in enumerate(ordered_sets(ev)):
        e = engines.get(primary) if i == 0 else None
        rows.append({
            **common, "engine": primary, "engine_label": engine_label(primary), "set": name, "headline": i == 0,
            "prompts": s.get("num_prompts"), "tau": s.get("acceptance_length"),
            "tau_interval": (e or {}).get("tau_interval"), "rates": s.get("accept_rate_by_position") or [],
            "rate_intervals": (e or {}).get("rate_intervals"),
            "tokens_per_s_spec": s.get("tokens_per_s_spec"), "tokens_per_s_base": s.get("tokens_per_s_base"),
            "speedup": s.get("speedup"), "lossless_text": lossless_text(s if i else {**s, **_verdict_of(ev)}),
            "precision": (ev.get("precision") or {}).get("name") if isinstance(ev.get("precision"), dict)
            else ev.get("precision"), "device": ev.get("device")})
    first = rows[0]["set"] if rows else ev.get("primary_set")
    for name in ev.get("engine_order") or list(engines):
        if name == primary or name not in engines:
            continue
        e = engines[name]
        rows.append({
            **common, "engine": name, "engine_label": engine_label(name), "set": first, "headline": False,
            "prompts": e.get("prompts"), "tau": e.get("tau"), "tau_interval": e.get("tau_interval"),
            "rates": e.get("accept_rate_by_position") or [], "rate_intervals": e.get("rate_intervals"),
            "tokens_per_s_spec": e.get("tokens_per_s_spec"), "tokens_per_s_base": e.get("tokens_per_s_base"),
            "speedup": e.get("speedup"), "lossless_text": lossless_text(e), "precision": e.get("precision"),
            "device": None})
    return rows


VOCAB_REACH_LOW = 0.10
"""A prompt set whose target answers fall outside the draft vocab more often than this gets the hint."""


def vocab_reach_text(ev: dict | None) -> str | None:
    """The share of the target's answer tokens, per prompt set, that the draft vocab holds (`vocab_reach` of
    eagle3.acceptance), with the remedy where a set loses more than VOCAB_REACH_LOW; None for a report without it."""
    reach = [(name, s["vocab_reach"]) for name, s in ordered_sets(ev or {})
             if (s.get("vocab_reach") or {}).get("tokens")]
    if not reach:
        return None
    vd = reach[0][1].get("draft_vocab_size")
    text = f"the draft vocab ({fmt(vd)} tokens) holds the target's answer tokens: " + ", ".join(
        f"{100 * (1 - r['share_outside']):.1f}% on {name}" for name, r in reach)
    low = [name for name, r in reach if r["share_outside"] > VOCAB_REACH_LOW]
    if low:
        text += (f"; no draft step can propose the rest, which caps τ on {' and '.join(low)}: training data like those "
                 "prompts lifts the cap and teaches the draft (the vocab is the training answers' most frequent "
                 "tokens); a larger draft_vocab_size lifts only the cap")
    return text


def tie_flips(ev: dict | None) -> list[dict]:
    """Every engine's tie flips (eagle3.evaluate.lossless), each with its engine's label: what the report lists
    under the acceptance table, margins included, so a reader can judge them."""
    ev = ev or {}
    verdicts = {name: e.get("lossless_verdict") for name, e in (ev.get("engines") or {}).items()}
    if not verdicts:
        verdicts = {ev.get("backend"): ev.get("lossless_verdict")}
    return [{"engine": engine_label(name), "precision": v.get("precision"), **t}
            for name, v in verdicts.items() if isinstance(v, dict) for t in v.get("tie_flips") or []]


def _verdict_of(ev: dict) -> dict:
    """The primary engine's own verdict for its headline set (report.json's top level mixes in every engine's
    ``lossless`` when engines were compared)."""
    primary = ev.get("backend")
    e = (ev.get("engines") or {}).get(primary)
    if e:
        return {k: e[k] for k in ("lossless", "lossless_verdict") if k in e}
    return {k: ev[k] for k in ("lossless", "lossless_verdict") if k in ev}


def run_status(task_states: list[dict] | None, errors: dict[tuple[str, int], dict]) -> dict[str, Any]:
    """{"failed": [{"task", "error", "lines"}], "not_run": [task], "skipped": [task], "counts": {state: n}}.

    ``task_states``: [{"task_id", "map_index", "state", "name"?}] (Airflow's); None when unknown, and then
    the failures are the kept errors alone."""
    from eagle3.report.failures import label

    failed, not_run, skipped, counts = [], [], [], {}
    if task_states is None:
        task_states = [{"task_id": t, "map_index": i, "state": "failed"} for t, i in errors]
    for ts in sorted(task_states, key=lambda t: (t["task_id"], t.get("map_index", -1))):
        if ts["task_id"] == VERDICT_TASK:
            continue
        state = ts.get("state") or "none"
        counts[state] = counts.get(state, 0) + 1
        key = (ts["task_id"], int(ts.get("map_index", -1)))
        rec = errors.get(key) or {}
        name = label(key[0], key[1], ts.get("name") or rec.get("name"))
        if state == "failed":
            failed.append({"task": name, "error": rec.get("error"), "lines": rec.get("lines") or [],
                           "try_number": rec.get("try_number")})
        elif state == "upstream_failed":
            not_run.append(name)
        elif state == "skipped":
            skipped.append(name)
    return {"failed": failed, "not_run": not_run, "skipped": skipped, "counts": counts}
