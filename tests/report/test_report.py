"""The run report: every part present, and robustness to missing parts."""

from __future__ import annotations

import json

from eagle3 import storage
from eagle3.report import training_curves, write_report, write_run_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path):
    run, prep = tmp_path / "run", tmp_path / "prep"
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
    summary = write_run_report(run_dir=run, prepared=prep)
    out = tmp_path / "run" / "report"
    assert summary["plots"] == ["acceptance.png", "comparison.png", "datasets.png", "training.png"]
    for name in summary["plots"]:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    report = json.loads((out / "report.json").read_text())
    shares = {r["dataset"]: (r["sample_share"], r["token_share"]) for r in report["datasets"]}
    assert shares["code"] == (0.1, 0.6) and shares["chat"] == (0.9, 0.4)
    assert report["comparison"]["previous_tau"] == 2.1 and report["comparison"]["sim_tau"] == 1.59
    assert report["acceptance_length"] == 1.8 and report["lossless"] is True
    assert "prompts" not in report["evaluate"]
    assert report["missing"] == []
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "does not beat the previous best 2.100" in page


def test_report_with_nothing_but_a_checkpoint(tmp_path):
    run, _ = _run(tmp_path)
    report = write_report(str(tmp_path / "out"), checkpoint=run + "/checkpoint")
    assert report["plots"] == ["training.png"]
    assert len(report["missing"]) == 3 and report["acceptance_length"] is None
    assert "No evaluation yet" in (tmp_path / "out" / "report.html").read_text()


def test_report_of_an_empty_run_still_renders(tmp_path):
    summary = write_run_report(run_dir=str(tmp_path / "empty"))
    assert summary["plots"] == [] and len(summary["missing"]) == 4
    assert (tmp_path / "empty" / "report" / "report.html").exists()


def test_training_curves_read_flat_keys_too(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss_0": 2.0, "loss_1": 3.0, "acc_0": 0.1,
                                                        "acc_1": 0.05, "tokens_0": 9.0}) + "\n")
    curves = training_curves(str(tmp_path))
    assert curves["train"][0]["loss_i"] == [2.0, 3.0] and curves["train"][0]["acc_i"] == [0.1, 0.05]


def test_report_on_s3(s3_bucket, tmp_path):
    run, prep = _run(tmp_path)
    for name in storage.list_files(run):
        storage.put_file(f"{run}/{name}", f"{s3_bucket}/run/{name}")
    summary = write_run_report(run_dir=f"{s3_bucket}/run", prepared=prep)
    assert "report.html" in storage.list_files(summary["out"])
    assert storage.read_bytes(f"{summary['out']}/training.png").startswith(PNG_MAGIC)
