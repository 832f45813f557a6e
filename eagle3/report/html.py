"""report.html: one self-contained page (plots inlined as data: URIs), so it can be
served from any store, or opened from disk, without its PNG neighbours."""

from __future__ import annotations

import base64
import html
from typing import Any

from eagle3.acceptance import ordered_sets

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1100px;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
.ok{color:#0a7d32;font-weight:bold} .bad{color:#b00020;font-weight:bold} .muted{color:#777}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
"""


def _fmt(v: Any) -> str:
    if v is None:
        return '<span class="muted">n/a</span>'
    if isinstance(v, bool):
        return f'<span class="{"ok" if v else "bad"}">{v}</span>'
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return html.escape(str(v))


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img(plots: dict[str, bytes], name: str, alt: str) -> str:
    if name not in plots:
        return ""
    data = base64.b64encode(plots[name]).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _interval(point, iv) -> str:
    if point is None:
        return "n/a"
    return f"{point:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")


def _engines_section(ev: dict) -> list[str]:
    """The draft on each engine (the project decoder, vLLM): τ and P(accept) per position with 95% intervals,
    and whether the engines disagree more than their prompts allow."""
    engines = ev.get("engines") or {}
    if len(engines) < 2:
        return []
    k = max(len(e.get("accept_rate_by_position") or []) for e in engines.values())
    rows = [[name, e.get("prompts"), _interval(e.get("tau"), e.get("tau_interval")),
             *[_interval(r, iv) for r, iv in zip(e.get("accept_rate_by_position") or [], e.get("rate_intervals") or [])],
             e.get("tokens_per_s_spec"), e.get("tokens_per_s_base"), _fmt(bool(e.get("lossless")))]
            for name, e in ((n, engines[n]) for n in ev.get("engine_order") or engines)]
    out = ["<h2>Engines side by side</h2>",
           _table(["engine", "prompts", "τ [95% CI]", *[f"P(accept) pos {i + 1}" for i in range(k)],
                   "tok/s spec", "tok/s base", "lossless"], rows)]
    for name, a in (ev.get("agreement") or {}).items():
        verdict = "agree within the intervals" if a.get("agree") else "DISAGREE more than the prompts allow"
        diff = a["tau"]
        out.append(f"<p>{html.escape(name)} vs {html.escape(str(a.get('against')))}: {verdict}; τ difference "
                   f"{_interval(diff.get('difference'), diff.get('interval'))}; same greedy output on "
                   f"{a.get('same_greedy_output')} of {a.get('prompts_compared')} prompts.</p>")
    return out


def render_html(report: dict, plots: dict[str, bytes]) -> str:
    ev, cmp, pub = report.get("evaluate") or {}, report.get("comparison") or {}, report.get("publish")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(report['title'])}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(report['title'])}</h1>"
             f"<p class='muted'>written {html.escape(report['created_at'])}</p>"]

    parts.append("<h2>Speculative decoding</h2>")
    if ev:
        parts.append(_table(["metric", "value"], [
            ["acceptance length τ (tokens per verification)", ev.get("acceptance_length")],
            ["draft steps k (τ ≤ k+1)", ev.get("steps")],
            ["lossless (speculative == greedy, every prompt)", ev.get("lossless")],
            ["tokens/s with speculation", ev.get("tokens_per_s_spec")],
            ["tokens/s baseline", ev.get("tokens_per_s_base")],
            ["speedup", ev.get("speedup")],
            ["offline simulated τ at k (trainer, held-out)", cmp.get("sim_tau")],
            ["prompts (headline set)", f"{ev.get('num_prompts')} from {ev.get('prompts_source')}"],
            ["backend / device", f"{ev.get('backend')} / {ev.get('device')} ({ev.get('dtype')})"],
        ]))
        sets = dict(ordered_sets(ev))
        k = max(len(s.get("accept_rate_by_position") or []) for s in sets.values())
        parts.append(_table(["prompt set", "prompts", "τ", "tok/s spec", "tok/s base", "speedup",
                             *[f"P(accept) pos {i + 1}" for i in range(k)]],
                            [[name, s.get("num_prompts"), s.get("acceptance_length"), s.get("tokens_per_s_spec"),
                              s.get("tokens_per_s_base"), s.get("speedup"), *(s.get("accept_rate_by_position") or [])]
                             for name, s in sets.items()]))
    else:
        parts.append("<p class='muted'>No evaluation yet.</p>")
    parts.append(_img(plots, "acceptance.png", "acceptance rate by position"))
    parts.append(_img(plots, "comparison.png", "tau and tokens/s against the baseline and the previous draft"))

    parts.append("<h2>Publish gate</h2>")
    if pub:
        prev = (pub.get("compared") or {}).get("previous_best") or {}
        parts.append(f"<p>{_fmt(bool(pub.get('published')))} — {html.escape(str(pub.get('reason')))}</p>")
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

    parts += _engines_section(ev)

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
