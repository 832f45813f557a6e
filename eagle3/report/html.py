"""report.html: one self-contained page (plots inlined as data: URIs), so it can be
served from any store, or opened from disk, without its PNG neighbours.

Every value from an artifact is escaped exactly once, when it becomes a cell (``_cell``); markup this
module builds itself is a ``_Html`` and passes through unchanged. Wide tables sit in a box that scrolls
sideways, so nothing is drawn over its neighbours at any width.
"""

from __future__ import annotations

import base64
import html
from typing import Any

from eagle3.report.summary import fmt, headline_rows, tie_flips

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ddd}
.scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
.ok{color:#0a7d32;font-weight:bold} .bad{color:#b00020;font-weight:bold} .muted{color:#777}
.failed{border:1px solid #b00020;background:#fff5f5;padding:.4em 1em;margin:.5em 0}
pre{white-space:pre-wrap;margin:.2em 0}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
"""


class _Html(str):
    """Markup built here: inserted as it is (never escaped again)."""


def _verdict(ok: bool | None, text: str) -> _Html:
    cls = "muted" if ok is None else ("ok" if ok else "bad")
    return _Html(f'<span class="{cls}">{html.escape(text)}</span>')


def _cell(v: Any) -> str:
    if isinstance(v, _Html):
        return v
    if v is None:
        return f'<span class="muted">{fmt(None)}</span>'
    if isinstance(v, bool):
        return str(_verdict(v, "yes" if v else "no"))
    return html.escape(fmt(v))


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def _img(plots: dict[str, bytes], name: str, alt: str) -> str:
    if name not in plots:
        return ""
    data = base64.b64encode(plots[name]).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _interval(point, iv) -> str:
    return fmt(point) + (f" [{fmt(iv[0])}, {fmt(iv[1])}]" if point is not None and iv else "")


def _status_section(status: dict | None) -> list[str]:
    """The run's failed tasks with their first error lines, then what did not run or was skipped."""
    if not status:
        return []
    out = []
    for f in status.get("failed") or []:
        lines = "\n".join(f.get("lines") or []) or "(no error recorded: see the task's log)"
        out.append(f"<div class='failed'><b class='bad'>{html.escape(f['task'])} failed</b>"
                   f"{' (' + html.escape(str(f['error'])) + ')' if f.get('error') else ''}"
                   f"<pre>{html.escape(lines)}</pre></div>")
    if status.get("not_run"):
        out.append("<p>Did not run because an upstream task failed: "
                   + ", ".join(f"<code>{html.escape(t)}</code>" for t in status["not_run"]) + "</p>")
    if status.get("skipped"):
        out.append("<p class='muted'>Skipped: " + ", ".join(html.escape(t) for t in status["skipped"]) + "</p>")
    if not out:
        out.append("<p class='ok'>Every task before the report succeeded.</p>")
    return ["<h2>Run status</h2>", *out]


def _headline_section(ev: dict, cmp: dict) -> list[str]:
    rows = headline_rows(ev)
    k = max((len(r["rates"]) for r in rows), default=0)
    table = []
    for r in rows:
        ivs = r.get("rate_intervals") or [None] * len(r["rates"])
        table.append([r["engine_label"], r["set"], r["prompts"], _interval(r["tau"], r.get("tau_interval")),
                      *[_interval(a, iv) if iv else a for a, iv in zip(r["rates"], ivs)],
                      *[None] * (k - len(r["rates"])),
                      r["tokens_per_s_spec"], r["tokens_per_s_base"], r["speedup"],
                      _verdict(r["lossless_text"] != "FAILED", r["lossless_text"])])
    out = [f"<p>τ = tokens emitted per target verification with k = {html.escape(str(ev.get('steps')))} draft "
           f"steps (at most k+1), on {html.escape(str(ev.get('max_new_tokens')))} new tokens per prompt; the "
           "speedup is that engine's own speculative tok/s over its baseline tok/s on the same prompts. The first "
           "row is the headline (the publish gate compares it).</p>",
           _table(["engine", "prompt set", "prompts", "τ [95% CI]", *[f"P(accept) pos {i + 1}" for i in range(k)],
                   "tok/s speculative", "tok/s baseline", "speedup", "lossless"], table)]
    flips = tie_flips(ev)
    if flips:
        out.append("<p>Tie flips (a near-tie of the target's top two tokens that the precision's rounding swapped; "
                   "re-scored in fp32, not a failure):</p>" + _table(
                       ["engine", "prompt", "position", "fp32 margin", "tolerance (measured rounding)"],
                       [[f["engine"], f["id"], f["position"], f["margin_fp32"], f["tolerance"]]
                        for f in flips]))
    precision = ev.get("precision") or {}
    out.append(f"<p class='muted'>{html.escape(str(ev.get('backend')))} ran on {html.escape(str(ev.get('device')))} "
               f"in {html.escape(str(precision.get('name') if isinstance(precision, dict) else precision))}; the "
               f"trainer's offline estimate of τ at k (held-out split): {_cell(cmp.get('sim_tau'))}.</p>")
    for name, a in (ev.get("agreement") or {}).items():
        verdict = "agree within the intervals" if a.get("agree") else "DISAGREE more than the prompts allow"
        diff = a["tau"]
        out.append(f"<p>{html.escape(name)} vs {html.escape(str(a.get('against')))}: {verdict} on "
                   f"{html.escape(str(a.get('compared_on', 'all prompts')))}; τ difference "
                   f"{_interval(diff.get('difference'), diff.get('interval'))}; same greedy output on "
                   f"{a.get('same_greedy_output')} of {a.get('prompts_compared')} prompts.</p>")
    return out


def render_html(report: dict, plots: dict[str, bytes]) -> str:
    ev, cmp, pub = report.get("evaluate") or {}, report.get("comparison") or {}, report.get("publish")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(report['title'])}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(report['title'])}</h1>"
             f"<p class='muted'>written {html.escape(report['created_at'].replace('T', ' ').rstrip('Z'))} UTC</p>"]
    parts += _status_section(report.get("status"))

    parts.append("<h2>Speculative decoding</h2>")
    if ev:
        parts += _headline_section(ev, cmp)
    else:
        parts.append("<p class='muted'>No evaluation yet.</p>")
    parts.append(_img(plots, "acceptance.png", "acceptance rate by position"))
    parts.append(_img(plots, "comparison.png", "tau and tokens/s against the baseline and the previous draft"))

    parts.append("<h2>Publish gate</h2>")
    if pub:
        prev = (pub.get("compared") or {}).get("previous_best") or {}
        published = bool(pub.get("published"))
        parts.append(f"<p>{_verdict(published, 'published' if published else 'not published')} — "
                     f"{html.escape(str(pub.get('reason')))}</p>")
        parts.append(_table(["", "this draft", "previous best"], [
            ["τ", ev.get("acceptance_length"), prev.get("acceptance_length")],
            ["tokens/s speculative", ev.get("tokens_per_s_spec"), prev.get("tokens_per_s_spec")],
            ["tokens/s baseline", ev.get("tokens_per_s_base"), prev.get("tokens_per_s_base")],
            ["entry", pub.get("entry_id"), prev.get("id")],
        ]))
        if pub.get("location"):
            parts.append(f"<p>published to <code>{html.escape(pub['location'])}</code></p>")
    else:
        parts.append("<p class='muted'>No publish decision.</p>")

    sg = report.get("sglang")
    if sg:
        parts.append("<h2>SGLang benchmark</h2>")
        parts.append(_table(["metric", "value"], [
            ["τ = Σ completion_tokens / Σ spec_verify_ct", sg.get("acceptance_length")],
            ["server avg_spec_accept_length", sg.get("server_accept_length")],
            ["tokens/s speculative", sg.get("tokens_per_s_spec")], ["tokens/s baseline", sg.get("tokens_per_s_base")],
            ["speedup", sg.get("speedup")]]))

    parts.append("<h2>Training</h2>")
    tr = report.get("training")
    if tr:
        last = tr.get("last_eval") or tr.get("last_train") or {}
        parts.append(_table(["", "value"], [["train / eval events", f"{tr['train_events']} / {tr['eval_events']}"],
                                            ["last step", last.get("step")],
                                            ["simulated τ", last.get("sim_accept_len")]]))
    parts.append(_img(plots, "training.png", "loss and acc per TTT step"))

    parts.append("<h2>Datasets</h2>")
    rows = report.get("datasets") or []
    if rows:
        parts.append(_table(["dataset", "samples", "tokens", "sample share", "token share"],
                            [[r["dataset"], r["samples"], r["tokens"], r["sample_share"], r["token_share"]]
                             for r in rows]))
        parts.append(f"<p class='muted'>from {html.escape(str(report.get('datasets_origin')))}</p>")
    parts.append(_img(plots, "datasets.png", "token share vs sample share"))

    if report.get("missing"):
        parts.append("<h2>Not available</h2><ul>" +
                     "".join(f"<li>{html.escape(m)}</li>" for m in report["missing"]) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)
