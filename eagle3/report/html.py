"""report.html: one self-contained page (plots inlined as data: URIs), so it can be
served from any store, or opened from disk, without its PNG neighbours.

What it says is eagle3.report.view's, the same texts and tables as the UI's report tab; this module only lays
them out. Every text is escaped exactly once, here, when it becomes markup. Wide tables sit in a box that
scrolls sideways, so nothing is drawn over its neighbours at any width.
"""

from __future__ import annotations

import base64
import html

from eagle3.report.view import Cell, Table, sections

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ddd}
.scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child,td.l,th.l{text-align:left} tr.flagged td{background:#fff5f5}
.ok{color:#0a7d32;font-weight:bold} .bad{color:#b00020;font-weight:bold} .muted{color:#777}
.failed{border:1px solid #b00020;background:#fff5f5;padding:.4em 1em;margin:.5em 0}
pre{white-space:pre-wrap;margin:.2em 0}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
"""

_e = html.escape


def _cell(c: Cell) -> str:
    text = _e(c.text)
    if c.strong:
        text = f"<b>{text}</b>"
    return f'<span class="{c.tone}">{text}</span>' if c.tone else text


def _table(t: Table | None) -> str:
    if t is None:
        return ""

    def cls(i: int) -> str:
        return " class='l'" if i in t.left and i else ""  # the first column is left-aligned by the CSS

    head = "".join(f"<th{cls(i)}>{_e(h)}</th>" for i, h in enumerate(t.header))
    body = "".join((f"<tr class='{tone}'>" if tone else "<tr>")
                   + "".join(f"<td{cls(i)}>{_cell(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row, tone in zip(t.rows, t.row_tones or [""] * len(t.rows)))
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def _p(text: str | None, tone: str = "") -> str:
    if not text:
        return ""
    attr = f" class='{tone}'" if tone else ""
    return f"<p{attr}>{_e(text)}</p>"


def _missing(text: str) -> str:
    return f"<p class='muted'>{_e(text)}</p>"


def _img(plots: dict[str, bytes], name: str, alt: str) -> str:
    if name not in plots:
        return ""
    data = base64.b64encode(plots[name]).decode()
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _status(st: dict | None) -> list[str]:
    if not st:
        return []
    out = ["<h2>Run status</h2>"]
    for f in st["failed"]:
        out.append(f"<div class='failed'><b class='bad'>{_e(f['title'])}</b>"
                   f"{' (' + _e(f['note']) + ')' if f['note'] else ''}<pre>{_e(f['text'])}</pre></div>")
    for key, tone in (("not_run", ""), ("skipped", "muted")):
        if st[key]:
            out.append(f"<p{f' class={tone!r}' if tone else ''}>{_e(st[key]['label'])} "
                       + ", ".join(f"<code>{_e(t)}</code>" for t in st[key]["tasks"]) + "</p>")
    out.append(_p(st["ok"], "ok"))
    return out


def render_html(report: dict, plots: dict[str, bytes], task_states: dict[str, str] | None = None) -> str:
    """The page of a report.json (eagle3.report.collect's content plus title and created_at) and its PNGs;
    ``task_states`` ({task_id: state}) say why a section is missing."""
    v = sections(report, task_states)
    why = v["why"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(report['title'])}</title>"
             f"<style>{_CSS}</style></head><body><h1>{_e(report['title'])}</h1>"
             f"<p class='muted'>written {_e(report['created_at'].replace('T', ' ').rstrip('Z'))} UTC</p>"]
    parts += _status(v["status"])

    parts.append("<h2>Speculative decoding</h2>")
    acc = v["acceptance"]
    if acc:
        parts += [_p(acc["intro"]), _table(acc["table"]), _p(acc["tie_flips_intro"]), _table(acc["tie_flips"]),
                  _p(acc["notes"], "muted"), *[_p(line) for line in acc["agreement"]]]
    else:
        parts.append(_missing(why["Acceptance"]))
    parts.append(_img(plots, "acceptance.png", "acceptance rate by position"))
    parts.append(_img(plots, "comparison.png", "tau and tokens/s against the baseline and the previous draft"))

    parts.append("<h2>Publish gate</h2>")
    pub = v["publish"]
    if pub:
        parts.append(f"<p>{_cell(pub['verdict'])} — {_e(pub['reason'])}</p>")
        parts.append(_table(pub["table"]))
        if pub["location"]:
            parts.append(f"<p>published to <code>{_e(pub['location'])}</code></p>")
    else:
        parts.append(_missing(why["Publish gate"]))

    if v["sglang"]:
        parts += ["<h2>SGLang benchmark</h2>", _table(v["sglang"])]

    parts.append("<h2>Training</h2>")
    tr = v["training"]
    if tr:
        parts += [_p(tr["summary"]), _table(tr["last"]), _table(tr["per_step"])]
    else:
        parts.append(_missing(why["Training"]))
    parts.append(_img(plots, "training.png", "loss and acc per TTT step"))

    parts.append("<h2>Datasets</h2>")
    ds = v["datasets"]
    if ds:
        parts.append(_table(ds["table"]))
        if ds["flagged"]:
            parts.append("<p><b>Flagged datasets</b></p><ul>" + "".join(
                f"<li><b>{_e(f['dataset'])}</b>{': ' + _e(f['reason']) if f['reason'] else ''}</li>"
                for f in ds["flagged"]) + "</ul>")
        parts.append(_p(ds["no_flag"], "muted"))
        parts.append(_p(ds["origin"], "muted"))
    else:
        parts.append(_missing(why["Dataset stats"]))
    parts.append(_img(plots, "datasets.png", "token share vs sample share"))

    parts.append("<h2>Gate verdicts</h2>")
    if v["verify"]:
        parts += [f"<p>{_cell(v['verify']['verdict'])}</p>", _table(v["verify"]["table"])]
    else:
        parts.append(_missing(why["Gate verdicts"]))

    parts.append("<h2>Extraction</h2>")
    x = v["extraction"]
    if x:
        if x["stores"]:
            parts += [_p(x["note"], "muted"), _table(x["stores"])]
        parts += [_p(x["planned"], "muted"), _table(x["run"])]
    else:
        parts.append(_missing(why["Extraction"]))

    if v["reused"]:
        parts.append("<h2>Reused from earlier runs</h2><ul>" + "".join(f"<li>{_e(line)}</li>" for line in v["reused"])
                     + "</ul>")
    if report.get("missing"):
        parts.append("<h2>Not plotted</h2><ul>" + "".join(f"<li>{_e(m)}</li>" for m in report["missing"]) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)
