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
