"""Engines side by side: report.json's `engines` and `agreement` from two engines' per-prompt records, the report
page's section and the demo's lines built from them."""

from __future__ import annotations

import pytest

from eagle3.evaluate.compare import combine, disagreements


def _report(accepts: list[int], backend: str, k: int = 3) -> dict:
    """One engine's report: prompt i had 10 verifications that each accepted accepts[i] tokens."""
    rows = []
    for i, a in enumerate(accepts):
        counts = {"verifications": 10, "emitted": 10 * (a + 1), "reached": [10 if j <= a else 0 for j in range(k)],
                  "accepted": [10 if j < a else 0 for j in range(k)]}
        rows.append({"set": "s", "id": f"p{i}", "counts": counts, "lossless": True, "token_ids": [i, 1, 2]})
    return {"prompts": rows, "primary_set": "s", "tokens_per_s_spec": 2.0, "tokens_per_s_base": 1.0, "speedup": 2.0,
            "lossless": True, "precision": {"name": "float32"}, "backend": backend}


def test_equal_engines_agree_and_a_shifted_one_is_flagged():
    ours = _report([0, 1, 2, 1, 0, 2, 1, 1], "transformers")
    same = combine({"transformers": ours, "vllm": _report([0, 1, 2, 1, 0, 2, 1, 1], "vllm")}, "transformers")
    assert same["engines"]["transformers"]["tau"] == same["engines"]["vllm"]["tau"] == pytest.approx(2.0)
    assert same["agreement"]["vllm"]["agree"] and same["agreement"]["vllm"]["same_greedy_output"] == 8
    assert disagreements(same) == []
    shifted = combine({"transformers": ours, "vllm": _report([2, 3, 3, 3, 2, 3, 3, 3], "vllm")}, "transformers")
    a = shifted["agreement"]["vllm"]
    assert not a["agree"] and not a["tau"]["agree"] and a["tau"]["difference"] < 0
    assert "vllm vs transformers: τ differs by" in disagreements(shifted)[0]
    assert shifted["engine_order"] == ["transformers", "vllm"]


def test_prompts_that_diverged_are_left_out_of_the_agreement_but_kept():
    # prompts 0-3: vLLM took another continuation (a tie flip), where its acceptance is much higher; prompts
    # 4-11 decode alike with the same acceptance: the engines agree on those, which is the comparable part
    ours = _report([0, 0, 0, 0, 1, 2, 1, 0, 2, 1, 1, 2], "transformers")
    theirs = _report([3, 3, 3, 3, 1, 2, 1, 0, 2, 1, 1, 2], "vllm")
    for row in theirs["prompts"][:4]:
        row["token_ids"] = [7, 7, 7]
    a = combine({"transformers": ours, "vllm": theirs}, "transformers")["agreement"]["vllm"]
    assert a["agree"] and a["prompts"] == 8 and a["compared_on"] == "the 8 prompts with the same greedy output"
    assert not a["all_prompts"]["agree"] and a["all_prompts"]["prompts"] == 12
    assert a["same_greedy_output"] == 8 and a["prompts_compared"] == 12
    # a mismatch that changes acceptance, never the output, still shows on the prompts decoded alike
    shifted = _report([0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3], "vllm")
    for row in shifted["prompts"][:4]:
        row["token_ids"] = [7, 7, 7]
    b = combine({"transformers": ours, "vllm": shifted}, "transformers")["agreement"]["vllm"]
    assert not b["agree"] and b["prompts"] == 8


def test_the_report_page_and_the_demo_show_both_engines(tmp_path, capsys):
    import json
    import sys
    from pathlib import Path

    from eagle3.layout import RunLayout
    from eagle3.report.collect import acceptance
    from eagle3.report.html import render_html

    report = combine({"transformers": _report([1] * 6, "transformers"), "vllm": _report([3] * 6, "vllm")},
                     "transformers")
    html = render_html({"title": "run", "created_at": "2026-12-03T00:00:00Z", "acceptance": acceptance(report)}, {})
    assert "vLLM" in html and "project decoder" in html and "DISAGREE" in html
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
    import run_demo

    layout = RunLayout(str(tmp_path), run_demo.DAG_ID, "manual__1")
    eval_dir = Path(layout.folder("eval"))
    eval_dir.mkdir(parents=True)
    report["vocab_reach"] = {"tokens": 200, "outside": 70, "share_outside": 0.35, "draft_vocab_size": 2048}
    (eval_dir / "report.json").write_text(json.dumps(report))
    run_demo.summarize(Path(layout.dir))
    out = capsys.readouterr().out
    assert "the draft vocab (2,048 tokens) holds the target's answer tokens: 65.0% on None; no draft step" in out
    assert "project decoder (transformers) on" in out and "[2.00, 2.00]" in out
    assert "vLLM on None (6 prompts): tau 4.000" in out and "DISAGREE beyond the intervals" in out
