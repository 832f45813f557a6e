"""How a run's report content reads: the texts and tables that report.html and the UI's report tab both print.

    sections(content, task_states=None, run_state=None) -> {"status", "acceptance", "publish", "sglang",
        "datasets", "training", "verify", "extraction", "reused", "why"}

``content`` is :func:`eagle3.report.collect.collect`'s; a section is None when its files do not exist, and
``why[title]`` then says why, from the state of the task that writes it. Every figure goes through the one
formatter (``eagle3.report.summary.fmt``/``fmt_metric``) into a :class:`Cell`; a page escapes a cell's text once
and maps its tone to a colour, so the two pages show the same strings and differ in layout only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from eagle3.report.summary import fmt, fmt_metric


@dataclass(frozen=True)
class Cell:
    text: str
    tone: str = ""
    """"ok", "bad", "muted" or "": the colour a page gives it."""
    strong: bool = False
    """The headline figure."""


@dataclass(frozen=True)
class Table:
    id: str
    """An anchor for the UI page (report.html leaves it out)."""
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    row_tones: tuple[str, ...] = ()
    """Per row: "flagged" or ""."""
    left: tuple[int, ...] = (0,)
    """The columns of names and prose (left-aligned); the others hold figures."""


def cell(value: Any, key: str | None = None, strong: bool = False) -> Cell:
    """A figure as printed: ``fmt`` (``fmt_metric`` for a metric's ``key``); a bool is a yes/no verdict."""
    if isinstance(value, Cell):
        return value
    if isinstance(value, bool):
        return Cell(fmt(value), "ok" if value else "bad", strong)
    return Cell(fmt_metric(key, value) if key else fmt(value), "muted" if value is None else "", strong)


def verdict(ok: bool | None, text: str) -> Cell:
    return Cell(text, "muted" if ok is None else ("ok" if ok else "bad"))


def interval(point: Any, iv: Any) -> str:
    """``1.86 [1.55, 2.26]``: a figure with its 95% interval when there is one."""
    return fmt(point) + (f" [{fmt(iv[0])}, {fmt(iv[1])}]" if point is not None and iv else "")


def speedup(value: Any) -> str:
    return fmt(value) if value is None else f"{fmt(value)}×"


def table(id: str, header: Iterable[str], rows: Iterable[Iterable[Any]], row_tones: Iterable[str] = (),
          left: tuple[int, ...] = (0,)) -> Table:
    return Table(id, tuple(header), tuple(tuple(cell(v) for v in r) for r in rows), tuple(row_tones), left)


# -- sections ---------------------------------------------------------------------------------

def status_view(status: dict | None, run_state: str | None = None) -> dict | None:
    """Failed tasks with their first error lines, what did not run because of them, what was skipped."""
    if not status:
        return None
    failed = [{"title": f"{f['task']} failed",
               "note": ", ".join(str(x) for x in (f.get("error"), f.get("try_number") and f"try {f['try_number']}")
                                 if x),
               "text": "\n".join(f.get("lines") or []) or "(no error recorded in the run folder: see the task's log)"}
              for f in status.get("failed") or []]
    not_run, skipped = list(status.get("not_run") or []), list(status.get("skipped") or [])
    bad = bool(failed or not_run)
    ok = None if bad else "No task failed" + (f" so far (the run is {run_state})" if run_state and run_state
                                              not in ("success", "failed") else "") + "."
    return {"failed": failed, "ok": ok, "tone": "bad" if bad else ("ok" if run_state in (None, "success") else ""),
            "not_run": {"label": "Did not run because an upstream task failed:", "tasks": not_run} if not_run else None,
            "skipped": {"label": "Skipped:", "tasks": skipped} if skipped else None}


def _lossless(text: str) -> Cell:
    return verdict(None if text == "n/a" else text != "FAILED", text)


def acceptance_view(acc: dict) -> dict:
    rows = acc.get("rows") or []
    k = max((len(r["rates"]) for r in rows), default=0)
    body = []
    for r in rows:
        ivs = list(r.get("rate_intervals") or [])
        rates = [cell(a) if not (i < len(ivs) and ivs[i]) else Cell(interval(a, ivs[i]))
                 for i, a in enumerate(r["rates"])]
        body.append([Cell(r["engine_label"], strong=r["headline"]), r["set"], r["prompts"],
                     Cell(interval(r["tau"], r.get("tau_interval")), "muted" if r["tau"] is None else "",
                          r["headline"]),
                     *rates, *[None] * (k - len(rates)), r["tokens_per_s_spec"], r["tokens_per_s_base"],
                     speedup(r["speedup"]), _lossless(r["lossless_text"])])
    intro = (f"τ = tokens emitted per target verification, with k = {fmt(acc.get('steps'))} draft steps (at most "
             f"k+1), on {fmt(acc.get('max_new_tokens'))} new tokens per prompt; accept i = P(draft token i accepted "
             "| reached). Each row is one engine on one prompt set: its τ, and its speedup = its own speculative "
             "tok/s over its own baseline tok/s on the same prompts. The first row is the headline, the one the "
             "publish gate compares.")
    flips = acc.get("tie_flips") or []
    notes = []
    if acc.get("device"):
        engine = rows[0]["engine_label"] if rows else acc.get("backend") or "the decoder"
        notes.append(f"{engine} ran on {acc['device']}" + (f" in {acc['precision']}" if acc.get("precision") else ""))
    notes.append(f"the trainer's offline estimate of τ at k (held-out split): {fmt(acc.get('sim_accept_len'))}")
    if acc.get("vocab_reach"):
        notes.append(acc["vocab_reach"])
    prev = acc.get("previous")
    if prev:
        notes.append(f"previous best draft: {fmt(prev.get('id') or prev.get('run_id'))}, τ "
                     f"{fmt(prev.get('acceptance_length'))}, {fmt(prev.get('tokens_per_s_spec'))} tok/s speculative")
    elif acc.get("published") is not None:
        notes.append("no draft published before on this benchmark")
    agreement = []
    for name, a in (acc.get("agreement") or {}).items():
        diff = a.get("tau") or {}
        agreement.append(
            f"{name} vs {a.get('against')}: "
            f"{'agree within the intervals' if a.get('agree') else 'DISAGREE more than the prompts allow'} on "
            f"{a.get('compared_on', 'all prompts')}; "
            f"τ difference {interval(diff.get('difference'), diff.get('interval'))}; "
            f"same greedy output on {fmt(a.get('same_greedy_output'))} of {fmt(a.get('prompts_compared'))} prompts.")
    return {
        "intro": intro,
        "table": table("acceptance", ["engine", "prompt set", "prompts", "τ [95% CI]",
                                      *[f"accept {i + 1}" for i in range(k)], "tok/s speculative", "tok/s baseline",
                                      "speedup", "lossless"], body, ["headline" if r["headline"] else "" for r in rows],
                       left=(0, 1)),
        "tie_flips_intro": "Tie flips (a near-tie of the target's top two tokens that the precision's rounding "
                           "swapped; re-scored in fp32, not a failure):" if flips else None,
        "tie_flips": table("tie-flips", ["engine", "prompt", "position", "fp32 margin",
                                         "tolerance (measured rounding)"],
                           [[f["engine"], f["id"], f["position"], f["margin_fp32"], f["tolerance"]] for f in flips])
        if flips else None,
        "notes": "; ".join(notes) + ".", "agreement": agreement,
    }


def publish_view(publish: dict, acc: dict | None) -> dict:
    acc, prev = acc or {}, (publish.get("compared") or {}).get("previous_best") or {}
    published = bool(publish.get("published"))
    return {"verdict": verdict(published, "published" if published else "not published"),
            "reason": str(publish.get("reason")), "location": publish.get("location"),
            "table": table("publish-compared", ["", "this draft", "previous best"], [
                ["τ", acc.get("tau"), prev.get("acceptance_length")],
                ["tok/s speculative", acc.get("tokens_per_s_spec"), prev.get("tokens_per_s_spec")],
                ["tok/s baseline", acc.get("tokens_per_s_base"), prev.get("tokens_per_s_base")],
                ["entry", publish.get("entry_id"), prev.get("id")]])}


def sglang_view(sg: dict) -> Table:
    return table("sglang", ["metric", "value"], [
        ["τ = Σ completion_tokens / Σ spec_verify_ct", sg.get("acceptance_length")],
        ["server avg_spec_accept_length", sg.get("server_accept_length")],
        ["tok/s speculative", sg.get("tokens_per_s_spec")], ["tok/s baseline", sg.get("tokens_per_s_base")],
        ["speedup", speedup(sg.get("speedup"))]])


def training_view(tr: dict) -> dict:
    per_step = tr.get("per_step") or {}
    n = max((len(v) for v in per_step.values()), default=0)
    return {
        "summary": f"{fmt(tr.get('events'))} metric events ({fmt(tr.get('train_events'))} train, "
                   f"{fmt(tr.get('eval_events'))} eval)"
                   + (f"; newest checkpoint {tr['latest']}" if tr.get("latest") else "") + ".",
        "last": table("training-last", ["metric", "value"],
                      [[k, cell(v, k)] for k, v in (tr.get("last") or {}).items()]) if tr.get("last") else None,
        "per_step": table("training-steps", ["", *[f"step {i}" for i in range(n)]],
                          [[k, *vs, *[None] * (n - len(vs))] for k, vs in per_step.items()]) if per_step else None,
    }


# Columns shown first in the dataset table; other scalar columns follow, long hashes are left out.
_FIRST = ["dataset", "category", "samples", "tokens", "loss_tokens", "rejected", "sample_share", "token_share",
          "tokens_mean", "tokens_p50", "tokens_p95", "tokens_max", "at_cap_share", "extract_hours", "reused", "flagged"]
_HIDDEN = {"fingerprint", "tokenizer_fingerprint", "source_uri", "reject_reasons", "name", "tokens_after_cap"}


def dataset_columns(rows: list[dict]) -> list[str]:
    seen = {k for r in rows for k, v in r.items() if not isinstance(v, (dict, list))} - _HIDDEN
    return [c for c in _FIRST if c in seen] + sorted(seen - set(_FIRST))


def datasets_view(ds: dict) -> dict:
    rows, flagged = ds.get("rows") or [], ds.get("flagged") or []
    cols = dataset_columns(rows)
    names = {f["dataset"] for f in flagged}
    def value(c: str, v: Any) -> Any:  # a flag is a warning; other yes/no columns are facts, not verdicts
        return Cell(fmt(v), "bad" if v and c == "flagged" else "") if isinstance(v, bool) else v

    return {"table": table("datasets", cols, [[value(c, r.get(c)) for c in cols] for r in rows],
                           ["flagged" if r.get("dataset") in names else "" for r in rows],
                           left=tuple(i for i, c in enumerate(cols) if c in ("dataset", "category"))),
            "flagged": [{"dataset": str(f["dataset"]), "reason": f.get("reason") or ""} for f in flagged],
            "no_flag": None if flagged else "No dataset flagged.", "origin": f"from {ds.get('origin')}"}


def verify_view(v: dict) -> dict:
    passed = bool(v.get("passed"))
    return {"verdict": verdict(passed, f"verify: {'PASSED' if passed else 'FAILED'}"),
            "table": table("verify", ["check", "verdict", "detail"],
                           [[c.get("name"), verdict(bool(c.get("passed")), "pass" if c.get("passed") else "FAIL"),
                             c.get("detail", "")] for c in v.get("checks") or []], left=(0, 2))}


def extraction_view(x: dict) -> dict:
    summary = x.get("summary")
    return {"note": "The hidden-state store (shared between runs: samples of earlier runs are not extracted again).",
            "stores": table("extraction", ["store", "tasks", "shards", "samples", "tokens"],
                            [[s["store"], s["tasks"], s["shards"], s["samples"], s["tokens"]]
                             for s in x.get("stores") or []]) if x.get("stores") else None,
            "planned": f"samples in the merged dataset: {fmt(x['planned_samples'])}" if x.get("planned_samples")
            else None,
            "run": table("extraction-run", ["this run's extract tasks", "value"],
                         [[k.replace("_", " "), v] for k, v in summary.items()]) if summary else None}


def reuse_lines(reuse: dict | None) -> list[str]:
    """What this run did not redo, in words."""
    reuse = reuse or {}
    lines = [f"dataset {ds}: tokenization reused (fingerprint unchanged)"
             for ds, state in sorted((reuse.get("tokenize") or {}).items()) if state == "reused"]
    if reuse.get("reused_samples"):
        lines.append(f"extraction: {fmt(reuse['reused_samples'])} samples already in the store, not extracted again")
    return lines


# The task whose output each section shows: a missing section says what happened to it.
SECTION_TASKS = {"Acceptance": ("evaluate", "eval/report.json"), "Publish gate": ("publish", "eval/publish.json"),
                 "Dataset stats": ("stats", "stats/stats_table.json"),
                 "Training": ("train", "checkpoint/metrics.jsonl"), "Gate verdicts": ("verify", "merged/verify.json"),
                 "Extraction": ("extract", "index-*.json in the store"),
                 "Plots": ("report", "a PNG in the report folder")}


def missing(section: str, task_states: dict[str, str] | None = None, run_state: str | None = None) -> str:
    """Why a section has nothing to show, from the state of the task that writes it."""
    task, what = SECTION_TASKS[section]
    state = (task_states or {}).get(task)
    if state == "failed":
        return f"{section} not produced: {task} failed (see Run status above)."
    if state == "upstream_failed":
        return f"{section} not produced: {task} did not run, because an upstream task failed."
    if state == "skipped":
        return f"{section} not produced: {task} was skipped."
    if state == "success":
        return f"{section} not available: {task} succeeded but {what} is missing."
    if state and state != "none":
        return f"{section} not yet available: {task} is {state.replace('_', ' ')}."
    if run_state in ("failed", "success"):
        return f"{section} not produced: {task} never ran in this run."
    return f"{section} not yet available ({what} missing)."


def sections(content: dict, task_states: dict[str, str] | None = None, run_state: str | None = None) -> dict:
    """Every section of the report as both pages print it (see the module docstring)."""
    c = content
    return {
        "status": status_view(c.get("status"), run_state),
        "acceptance": acceptance_view(c["acceptance"]) if c.get("acceptance") else None,
        "publish": publish_view(c["publish"], c.get("acceptance")) if c.get("publish") else None,
        "sglang": sglang_view(c["sglang"]) if c.get("sglang") else None,
        "datasets": datasets_view(c["datasets"]) if c.get("datasets") else None,
        "training": training_view(c["training"]) if c.get("training") else None,
        "verify": verify_view(c["verify"]) if c.get("verify") else None,
        "extraction": extraction_view(c["extraction"]) if c.get("extraction") else None,
        "reused": reuse_lines(c.get("reuse")),
        "why": {title: missing(title, task_states, run_state) for title in SECTION_TASKS},
    }
