"""What the report page, the UI tab and the demo print: τ, speedup and their engine from one place, the lossless
verdict per engine (evaluate's lossless_verdict text when it has one), and HTML escaped exactly once."""

from __future__ import annotations

from eagle3.report.collect import acceptance
from eagle3.report.html import render_html
from eagle3.report.summary import headline_rows, lossless_text, run_status
from tests.report.eval_reports import two_engine_report as _eval_report


def test_headline_rows_pair_each_tau_with_its_own_engine_and_set():
    rows = headline_rows(_eval_report())
    got = [(r["engine_label"], r["set"], r["tau"], r["speedup"], r["lossless_text"]) for r in rows]
    assert got == [("project decoder (transformers)", "humaneval", 1.86, 0.91, "exact up to 2 tie flips (bf16)"),
                   ("project decoder (transformers)", "chat", 1.12, 0.54, "FAILED"),  # 4 of 5 prompts
                   ("vLLM", "humaneval", 1.86, 1.64, "exact")]
    assert rows[0]["headline"] and rows[0]["tau_interval"] == [1.55, 2.26] and not rows[2]["headline"]


def test_lossless_text_prefers_evaluates_verdict():
    assert lossless_text({"lossless": True}) == "exact" and lossless_text({"lossless": False}) == "FAILED"
    assert lossless_text({}) == "n/a"
    assert lossless_text({"lossless": False, "lossless_verdict": {"text": "FAILED", "passed": False}}) == "FAILED"


def test_report_html_escapes_artifact_text_once_and_never_its_own_markup():
    ev = _eval_report()
    ev["sets"]["<script>x</script>"] = ev["sets"].pop("chat")
    ev["set_order"] = ["humaneval", "<script>x</script>"]
    status = run_status([{"task_id": "evaluate", "map_index": -1, "state": "failed"},
                         {"task_id": "publish", "map_index": -1, "state": "upstream_failed"},
                         {"task_id": "outcome", "map_index": -1, "state": "failed"}],
                        {("evaluate", -1): {"error": "GateFailed", "lines": ["vllm: differs <b>here</b>"]}})
    assert [f["task"] for f in status["failed"]] == ["evaluate"]  # outcome is the verdict, not one more failure
    page = render_html({"title": "t", "created_at": "2026-12-01T10:00:00Z", "acceptance": acceptance(ev),
                        "status": status}, {})
    assert '<span class="ok">exact up to 2 tie flips (bf16)</span>' in page
    assert '<span class="bad">FAILED</span>' in page and "&lt;span" not in page
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "evaluate failed" in page and "vllm: differs &lt;b&gt;here&lt;/b&gt;" in page
    assert "<code>publish</code>" in page and "written 2026-12-01 10:00:00 UTC" in page
    assert page.count("<div class='scroll'><table>") == page.count("<table>") == 2  # each in its own box
    # the tie flips are listed with their margins, under the acceptance table
    assert "<td>HumanEval/0</td><td>29</td><td>-0.1689</td><td>0.5022</td>" in page


def test_vocab_reach_text_names_the_sets_the_draft_vocab_cannot_serve():
    from eagle3.report.summary import vocab_reach_text

    def reach(outside, tokens=200):
        return {"tokens": tokens, "outside": outside, "share_outside": outside / tokens, "draft_vocab_size": 2048}

    ev = {"set_order": ["humaneval", "chat"],
          "sets": {"humaneval": {"vocab_reach": reach(12)}, "chat": {"vocab_reach": reach(70)}}}
    text = vocab_reach_text(ev)
    assert text.startswith("the draft vocab (2,048 tokens) holds the target's answer tokens: 94.0% on humaneval, "
                           "65.0% on chat; no draft step can propose the rest, which caps τ on chat:")
    assert "humaneval:" not in text and "draft_vocab_size" in text
    ev["sets"]["chat"]["vocab_reach"] = reach(20)  # 10%: at the line, no hint
    assert vocab_reach_text(ev).endswith("90.0% on chat")
    assert vocab_reach_text({"sets": {"chat": {}}}) is None and vocab_reach_text(None) is None


def test_the_report_page_shows_how_much_of_each_sets_answers_the_draft_vocab_holds():
    ev = _eval_report()
    ev["sets"]["chat"]["vocab_reach"] = {"tokens": 320, "outside": 112, "share_outside": 0.35,
                                         "draft_vocab_size": 2048}
    html = render_html({"title": "run", "created_at": "2026-12-05T00:00:00Z", "acceptance": acceptance(ev)}, {})
    assert "holds the target&#x27;s answer tokens: 65.0% on chat; no draft step" in html


def test_a_report_of_a_run_folder_that_is_not_there_says_so_and_names_the_runs(tmp_path, caplog):
    """A typo in --root, --dag-id or --run-id reads as an empty run: the report warns, naming the runs there."""
    import logging

    from eagle3.report import ReportConfig, report

    (tmp_path / "runs" / "d" / "manual__1" / "summaries").mkdir(parents=True)
    (tmp_path / "runs" / "d" / "manual__1" / "summaries" / "plan.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="eagle3.report.stage"):
        report(ReportConfig(root=str(tmp_path), dag_id="d", run_id="manual__2"))
    assert any("runs/d/manual__2 holds nothing of a run" in r.getMessage() and "(runs there: manual__1)"
               in r.getMessage() for r in caplog.records)
