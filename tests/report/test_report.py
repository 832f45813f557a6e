"""The run report: every part present, and robustness to missing parts."""

from __future__ import annotations

import json

import pytest

from eagle3 import storage
from eagle3.layout import RUN_SUMMARY_SCHEMA, RunLayout
from eagle3.report import ReportConfig, report, training_curves, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path):
    """A run folder as the DAG lays it out (eagle3.layout), with the stage outputs the report reads."""
    run, prep = tmp_path / "runs" / "dag" / "run1", tmp_path / "prepared"
    for name, samples, tokens in (("chat", 90, 20_000), ("code", 10, 30_000)):
        storage.write_json(str(prep / name / "stats.json"), {"dataset": name, "samples": samples, "tokens": tokens})
    lines = []
    for step in (10, 20, 30):
        lines.append({"event": "train", "step": step, "loss_i": [3 - step / 20, 3.5 - step / 20],
                      "acc_i": [step / 60, step / 90], "sim_accept_len": 1 + step / 60})
    lines.append({"event": "eval", "step": 30, "loss_i": [1.6, 2.1], "acc_i": [0.45, 0.3], "sim_accept_len": 1.59})
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    storage.write_json(str(run / "eval" / "report.json"), {
        "acceptance_length": 1.8, "lossless": True, "accept_rate_by_position": [0.5, 0.4, None], "steps": 3,
        "tokens_per_s_spec": 30.0, "tokens_per_s_base": 25.0, "speedup": 1.2, "sim_accept_len": 1.59,
        "prompts": [{"id": "x"}]})
    storage.write_json(str(run / "eval" / "publish.json"), {
        "published": False, "reason": "τ 1.800 does not beat the previous best 2.100 (entry e1)",
        "compared": {"previous_best": {"id": "e1", "acceptance_length": 2.1, "tokens_per_s_spec": 33.0}}})
    return str(run), str(prep)


def test_full_report(tmp_path):
    run, prep = _run(tmp_path)
    storage.write_json(f"{run}/summaries/tokenize.0.json", {"datasets": {"chat": {"reused": True}}})
    storage.write_json(f"{run}/summaries/tokenize.1.json", {"datasets": {"code": {"reused": False}}})
    storage.write_json(f"{run}/summaries/extract.0.json", {"samples_extracted": 3, "samples_skipped": 5, "tokens": 90})
    storage.write_json(f"{run}/summaries/merge.json", {"samples": 100})
    summary = report(ReportConfig(str(tmp_path), "dag", "run1"))
    out = tmp_path / "runs" / "dag" / "run1" / "report"
    assert summary["plots"] == ["acceptance.png", "comparison.png", "datasets.png", "training.png"]
    for name in summary["plots"]:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    written = json.loads((out / "report.json").read_text())
    shares = {r["dataset"]: (r["sample_share"], r["token_share"]) for r in written["datasets"]["rows"]}
    assert shares["code"] == (0.1, 0.6) and shares["chat"] == (0.9, 0.4)
    # the offline estimate at the report's k from the last held-out acc_i: 1 + 0.45 + 0.45 x 0.3 (a report without
    # sim_accept_len_k, as vLLM's and SGLang's are)
    assert written["comparison"]["previous_tau"] == 2.1 and written["comparison"]["sim_tau"] == pytest.approx(1.585)
    assert written["acceptance_length"] == 1.8 and written["lossless"] is True
    assert "prompts" not in written["evaluate"]
    assert written["missing"] == []
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "does not beat the previous best 2.100" in page
    run_summary = json.loads((tmp_path / "runs" / "dag" / "run1" / "run_summary.json").read_text())
    assert run_summary["schema"] == RUN_SUMMARY_SCHEMA
    assert run_summary["paths"] == RunLayout(str(tmp_path), "dag", "run1").paths()
    assert run_summary["tasks"]["merge"] == {"samples": 100} and len(run_summary["tasks"]["tokenize"]) == 2
    assert run_summary["reused"] == {"tokenize": {"chat": "reused", "code": "tokenized"}, "extracted_samples": 3,
                                     "reused_samples": 5, "extracted_tokens": 90}


def test_datasets_of_another_run_in_the_shared_prepared_folder_are_left_out(tmp_path):
    """Without a stats table the rows come from prepared/*/stats.json, a folder every run shares: only the
    datasets this run tokenized count (another run's `code` used to join the table and its shares)."""
    from eagle3.report.collect import read_datasets

    run, prep = _run(tmp_path)
    storage.write_json(f"{run}/summaries/tokenize.0.json", {"datasets": {"chat": {"reused": True}}})
    summary = report(ReportConfig(str(tmp_path), "dag", "run1"))
    written = json.loads((tmp_path / "runs" / "dag" / "run1" / "report" / "report.json").read_text())
    assert [(r["dataset"], r["sample_share"]) for r in written["datasets"]["rows"]] == [("chat", 1.0)]
    assert summary is not None
    paths = RunLayout(str(tmp_path), "dag", "run1").paths()
    assert read_datasets(paths, {}) is None  # nothing says which datasets are this run's (and no merged manifest)


def test_report_with_nothing_but_a_checkpoint(tmp_path):
    run, _ = _run(tmp_path)
    written = write_report(str(tmp_path / "out"), checkpoint=run + "/checkpoint")
    assert written["plots"] == ["training.png"]
    assert len(written["missing"]) == 3 and written["acceptance_length"] is None
    assert "Acceptance not yet available (eval/report.json missing)." in (tmp_path / "out" / "report.html").read_text()


def test_report_of_an_empty_run_still_renders(tmp_path):
    summary = report(ReportConfig(str(tmp_path), "dag", "empty"))
    assert summary["plots"] == [] and len(summary["missing"]) == 4
    assert (tmp_path / "runs" / "dag" / "empty" / "report" / "report.html").exists()


def test_training_curves_follow_the_metrics_schema(tmp_path):
    lines = [{"event": "train", "step": 1, "loss_i": [2.0, 3.0], "acc_i": [0.1, 0.05]},
             {"event": "eval", "step": 1, "loss_i": [2.5, 3.5], "acc_i": [0.2, 0.1], "sim_accept_len": 1.2},
             {"step": 2, "loss_0": 9.0}]  # no event: not a line of the schema, left out
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    curves = training_curves(str(tmp_path))
    assert [e["step"] for e in curves["train"]] == [1] and curves["eval"][0]["sim_accept_len"] == 1.2


def test_report_on_s3(s3_bucket, tmp_path):
    _run(tmp_path)
    for name in storage.list_files(str(tmp_path)):
        storage.put_file(f"{tmp_path}/{name}", f"{s3_bucket}/root/{name}")
    summary = report(ReportConfig(f"{s3_bucket}/root", "dag", "run1"))
    assert "report.html" in storage.list_files(summary["out"])
    assert storage.read_bytes(f"{summary['out']}/training.png").startswith(PNG_MAGIC)
