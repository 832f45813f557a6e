"""A run whose gate failed is a failed run: through `make demo`'s script (real `airflow dags test`), with a
lossless-gate failure planted after evaluate wrote report.json; and the pieces that say what failed."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow.conftest import REPO, airflow_env
from tests.airflow.tiny_data import tiny_conf, write_tiny_manifest

PLANT = Path(__file__).resolve().parent / "plant"


def test_first_lines_of_a_stage_child_failure():
    from eagle3.report.failures import first_lines

    message = ("evaluate exited with 3:\n2026-12-01 10:00:00,000 INFO eagle3.evaluate: tau 1.2\n"
               "eagle3 evaluate: error: transformers: speculative output differs on 1 prompt(s):\n"
               "  prompt p0: first difference at generated position 3\n(report: /r/eval/report.json)\nmore")
    assert first_lines(message) == ["transformers: speculative output differs on 1 prompt(s):",
                                    "  prompt p0: first difference at generated position 3",
                                    "(report: /r/eval/report.json)"]
    tb = "train exited with 1:\nTraceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'aux'"
    assert first_lines(tb) == ["KeyError: 'aux'"]
    assert first_lines("InputError: a.jsonl:3: bad json\nsecond") == ["InputError: a.jsonl:3: bad json", "second"]


def test_run_status_and_outcome_lines_name_failed_and_not_run_tasks(tmp_path):
    from eagle3.layout import RunLayout
    from eagle3.report import failures
    from eagle3.report.summary import run_status
    from operators.outcome import describe

    layout = RunLayout(str(tmp_path), "d", "r")
    failures.write(layout, "tokenize", 1, 1, ValueError("beta.jsonl:1: not JSON"), name="beta")
    failures.write(layout, "train", -1, 2, RuntimeError("OOM"))
    failures.clear(layout, "train", -1)  # a retry succeeded
    errors = failures.read(layout)
    assert set(errors) == {("tokenize", 1)}
    states = {("tokenize", 0): "success", ("tokenize", 1): "failed", ("merge", -1): "upstream_failed",
              ("publish", -1): "skipped", ("report", -1): "success"}
    assert describe(states, errors) == ["tokenize[beta] failed: ValueError: beta.jsonl:1: not JSON",
                                        "merge did not run: an upstream task failed"]
    status = run_status([{"task_id": t, "map_index": i, "state": s} for (t, i), s in states.items()], errors)
    assert status["failed"] == [{"task": "tokenize[beta]", "error": "ValueError",
                                 "lines": ["beta.jsonl:1: not JSON"], "try_number": 1}]
    assert status["not_run"] == ["merge"] and status["skipped"] == ["publish"]
    assert describe({("report", -1): "success", ("publish", -1): "skipped"}, {}) == []


def _states(home: Path) -> tuple[str, dict[str, str]]:
    db = sqlite3.connect(home / "airflow.db")
    run_id, state = db.execute("SELECT run_id, state FROM dag_run WHERE dag_id='eagle3_train' ORDER BY id DESC "
                               "LIMIT 1").fetchone()
    rows = db.execute("SELECT task_id, map_index, state FROM task_instance WHERE dag_id='eagle3_train' AND "
                      "run_id=?", (run_id,)).fetchall()
    return state, {(t if m < 0 else f"{t}[{m}]"): s for t, m, s in rows}


@pytest.mark.integration
def test_demo_with_a_failed_gate_fails_and_says_why(airflow_home, tmp_path, tiny_llama_dir):
    """`make demo`'s script on the tiny target, evaluate's lossless gate failing after report.json is written:
    the report still runs and says so, the run is failed, `airflow dags test` and the script exit non-zero,
    and the script's summary starts with the failed task and its error."""
    manifest = write_tiny_manifest(tmp_path / "data")
    root = tmp_path / "artifacts"
    conf = tiny_conf(manifest, tiny_llama_dir, str(root), extract_shards=1)
    env = airflow_env(airflow_home, EAGLE3_TEST_PLANT="lossless_gate",
                      PYTHONPATH=f"{PLANT}:{REPO}")
    proc = subprocess.run([sys.executable, str(REPO / "demo" / "run_demo.py"), "--artifacts", str(root),
                           "--scale", "0.02", "--more-data", "off", "--model", tiny_llama_dir,
                           "--conf", json.dumps(conf)],
                          env=env, capture_output=True, text=True, timeout=1200)
    out = proc.stdout
    assert proc.returncode == 1, out[-4000:] + proc.stderr[-3000:]
    summary = out[out.index("=== demo FAILED"):].splitlines()
    assert summary[0].endswith(": evaluate ==="), summary[:5]
    assert summary[1] == "evaluate failed:" and summary[2].strip().startswith(
        "GateFailed: transformers: speculative output differs from the baseline on 1 prompt(s):"), summary[:5]
    assert "did not run (an upstream task failed): publish" in out
    assert "lossless: FAILED" in out  # printed from report.json's lossless_verdict, per engine

    state, tis = _states(airflow_home)
    assert state == "failed", tis
    assert (tis["evaluate"], tis["publish"], tis["report"], tis["outcome"]) == (
        "failed", "upstream_failed", "success", "failed"), tis
    run = max((root / "runs" / "eagle3_train").iterdir(), key=lambda p: p.stat().st_mtime)
    assert json.loads((run / "eval" / "report.json").read_text())["lossless"] is False
    status = json.loads((run / "run_summary.json").read_text())["status"]
    assert [f["task"] for f in status["failed"]] == ["evaluate"] and status["not_run"] == ["publish"]
    assert "planted" in " ".join(status["failed"][0]["lines"])
    page = (run / "report" / "report.html").read_text()
    assert "evaluate failed" in page and "planted by tests/airflow/plant" in page
    assert '&lt;span class="bad"&gt;' not in page  # markup is never escaped twice
