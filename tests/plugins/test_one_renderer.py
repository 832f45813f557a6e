"""report.html (the report stage) and the UI's report tab print the same run with the same strings: every table
of one page is in the other, cell for cell, and so are the verdict lines; they differ in layout only."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from eagle3.report import ReportConfig, report
from eagle3_report import page, run_files
from report_run_folder import DAG_ID, RUN_ID
from tests.report.eval_reports import two_engine_report

TASKS = [{"task_id": t, "map_index": -1, "state": s} for t, s in (
    ("stats", "success"), ("verify", "success"), ("train", "success"), ("evaluate", "success"),
    ("publish", "success"), ("report", "success"))]


class _Page(HTMLParser):
    """The text of every table (header and rows, cell by cell) and of every paragraph of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.paragraphs: list[str] = []
        self._cell: list[str] | None = None
        self._p: list[str] | None = None
        self._skip = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "pre"):
            self._skip = True
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "p":
            self._p = []

    def handle_endtag(self, tag):
        if tag in ("style", "pre"):
            self._skip = False
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "p" and self._p is not None:
            self.paragraphs.append(" ".join("".join(self._p).split()))
            self._p = None

    def handle_data(self, data):
        if self._skip:
            return
        for part in (self._cell, self._p):
            if part is not None:
                part.append(data)


@pytest.fixture
def pages(artifacts):
    """(report.html, the UI page) of one run: two engines with intervals and tie flips, a publish decision
    against a previous best, the stats table with a flag, a failed verify check, store indexes, train metrics."""
    root = str(artifacts)
    (artifacts / "runs" / DAG_ID / RUN_ID / "eval" / "report.json").write_text(json.dumps(two_engine_report()))
    summaries = artifacts / "runs" / DAG_ID / RUN_ID / "summaries"
    summaries.mkdir()
    (summaries / "tokenize.0.json").write_text(json.dumps({"datasets": {"arithmetic": {"reused": True}}}))
    (summaries / "extract.0.json").write_text(json.dumps({"samples_extracted": 495, "samples_skipped": 100,
                                                         "tokens": 49_500}))
    report(ReportConfig(root, DAG_ID, RUN_ID, task_states=tuple(TASKS)))
    ui = page.render(run_files.load_run(DAG_ID, RUN_ID, root=root, tasks=TASKS, state="success"), "/eagle3")
    return _Page((artifacts / "runs" / DAG_ID / RUN_ID / "report" / "report.html").read_text()), _Page(ui)


def test_every_table_is_the_same_on_both_pages(pages):
    html, ui = pages
    assert sorted(html.tables) == sorted(ui.tables)
    # acceptance, tie flips, publish, training (last event, per TTT step), datasets, verify, extraction (store, run)
    assert len(ui.tables) == 9


def test_the_figures_read_as_computed_by_hand(pages):
    """An independent check of the shared strings: what the evaluate report, publish.json, the stats table and
    verify.json hold, printed by fmt (4 significant digits, thousands separators, × for a speedup)."""
    html, ui = pages
    for p in (html, ui):
        acceptance = next(t for t in p.tables if t[0][0] == "engine" and t[0][1] == "prompt set")
        assert acceptance[0] == ["engine", "prompt set", "prompts", "τ [95% CI]", "accept 1", "accept 2", "accept 3",
                                 "tok/s speculative", "tok/s baseline", "speedup", "lossless"]
        assert acceptance[1:] == [
            ["project decoder (transformers)", "humaneval", "5", "1.86 [1.55, 2.26]", "0.48", "0.49", "0.62", "19.2",
             "21.1", "0.91×", "exact up to 2 tie flips (bf16)"],
            ["project decoder (transformers)", "chat", "5", "1.12", "0.11", "0.11", "0", "11.5", "21.3", "0.54×",
             "FAILED"],
            ["vLLM", "humaneval", "5", "1.86 [1.55, 2.26]", "0.48", "0.49", "0.62", "25.3", "15.4", "1.64×", "exact"]]
        datasets = next(t for t in p.tables if t[0][0] == "dataset")
        assert datasets == [
            ["dataset", "samples", "tokens", "loss_tokens", "sample_share", "token_share", "reused", "flagged"],
            ["arithmetic", "930", "70,000", "20,000", "0.93", "0.68", "yes", "—"],
            ["long_agent", "70", "33,000", "9,000", "0.07", "0.32", "—", "yes"]]
        verify = next(t for t in p.tables if t[0] == ["check", "verdict", "detail"])
        assert verify[1:] == [["counts_add_up", "pass", "1000 in = 990 out + 10 drops"],
                              ["lengths_within_max_seq_len", "FAIL", "3 samples longer than 2048"]]
        published = next(t for t in p.tables if t[0] == ["", "this draft", "previous best"])
        assert published[1] == ["τ", "1.86", "2.1"]
        assert "verify: FAILED" in p.paragraphs
        assert "published — beats the previous best τ 2.100 (entry e-old)" in p.paragraphs
        assert ("vllm vs transformers: agree within the intervals on all prompts; τ difference 0 [-0.1, 0.1]; same "
                "greedy output on 5 of 5 prompts.") in p.paragraphs


def test_every_sentence_of_the_report_is_on_the_ui_page(pages):
    html, ui = pages
    shared = [p for p in html.paragraphs if not p.startswith("written ")]  # when report.html was written
    assert shared and [p for p in shared if p not in ui.paragraphs] == []
