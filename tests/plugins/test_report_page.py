"""The report page's reading, rendering, file serving and auth refusal (no api-server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from eagle3_report import app as report_app
from eagle3_report import page, run_files

from report_run_folder import DAG_ID, PLUGINS, RUN_ID, write_real_report, write_run


@pytest.fixture
def client(artifacts, monkeypatch):
    """The app with auth bypassed (auth is tested on its own below and through the real api-server)."""
    monkeypatch.setenv(run_files.ARTIFACTS_ENV, str(artifacts))
    report_app.app.dependency_overrides[report_app.authorized] = lambda: "tester"
    # no metadata DB here: the default root, the run's state and tasks unknown
    monkeypatch.setattr(report_app, "run_info", lambda dag_id, run_id: {"root": None, "state": None, "tasks": None})
    yield TestClient(report_app.app)
    report_app.app.dependency_overrides.clear()


class TestLoadRun:
    def test_reads_every_section(self, artifacts):
        run = run_files.load_run(DAG_ID, RUN_ID, root=str(artifacts))
        assert run["found"] and run["has_summary"]
        assert [r["dataset"] for r in run["datasets"]["rows"]] == ["arithmetic", "long_agent"]
        assert run["datasets"]["flagged"] == [{"dataset": "long_agent", "reason": "token share 32% vs sample share 7%"}]
        assert run["verify"]["passed"] is False
        store = run["extraction"]["stores"][0]
        assert (store["tasks"], store["shards"], store["samples"], store["tokens"]) == (2, 3, 795, 79_500)
        assert run["extraction"]["planned_samples"] == 990
        assert run["training"]["events"] == 3 and run["training"]["last"]["step"] == 30
        acc = run["acceptance"]
        assert (acc["tau"], acc["tokens_per_s_base"], acc["prompts"]) == (2.61, 30.2, 20)
        assert acc["previous"]["acceptance_length"] == 2.1 and acc["published"] is True
        assert acc["accept_rate_by_position"] == [0.8, 0.6, 0.45]
        assert [r["reused"] for r in run["datasets"]["rows"]] == [True, False]  # run_summary.json's reused
        assert "dataset arithmetic: tokenization reused (fingerprint unchanged)" in run["reused"]
        assert "extraction: 195 samples already in the store, not extracted again" in run["reused"]
        summary = run["extraction"]["summary"]
        assert (summary["tasks"], summary["samples_extracted"], summary["samples_skipped"], summary["tokens"]) == \
            (2, 795, 195, 79_500)
        assert run["training"]["latest"] == "step-00000030"
        assert sorted(run["plots"]) == [("report", "acceptance_by_position.png"), ("report", "training_curves.png")]
        assert run["report_html"] is True

    def test_reads_the_report_folder_eagle3_evaluate_writes(self, artifacts, client):
        """Contract with eagle3/report/stage.py: its report folder is found, plotted and served."""
        plots = write_real_report(artifacts / "runs" / DAG_ID / RUN_ID, artifacts)
        run = run_files.load_run(DAG_ID, RUN_ID, root=str(artifacts))
        assert plots and run["plots"] == [("report", name) for name in plots] and run["report_html"]
        html = client.get(f"/runs/{DAG_ID}/{RUN_ID}").text
        for name in plots:
            assert f"/files/report/{name}" in html
            assert client.get(f"/runs/{DAG_ID}/{RUN_ID}/files/report/{name}").content[:4] == b"\x89PNG"

    def test_default_layout_without_run_summary(self, tmp_path):
        """A run still going has no run_summary.json yet: the DAG's folder layout is used."""
        run = tmp_path / "runs" / DAG_ID / "r1"
        (run / "merged").mkdir(parents=True)
        (run / "merged" / "verify.json").write_text(json.dumps({"passed": True, "checks": []}))
        loaded = run_files.load_run(DAG_ID, "r1", root=str(tmp_path))
        assert loaded["found"] and not loaded["has_summary"]
        assert loaded["verify"] == {"passed": True, "checks": []}
        assert loaded["datasets"] is None and loaded["training"] is None and loaded["acceptance"] is None

    def test_a_summary_of_another_schema_is_not_read(self, tmp_path):
        run = tmp_path / "runs" / DAG_ID / "r2"
        run.mkdir(parents=True)
        (run / "run_summary.json").write_text(json.dumps({"summaries": {"extract": [{"tokens": 5}]},
                                                          "reused": {"reused_samples": 9}}))
        loaded = run_files.load_run(DAG_ID, "r2", root=str(tmp_path))
        assert loaded["found"] and not loaded["has_summary"]
        assert loaded["extraction"] is None and loaded["reused"] == []

    @pytest.mark.parametrize("bad", ["../etc", "a/b", "..", "x..y", ""])
    def test_refuses_ids_that_leave_the_runs_folder(self, bad, tmp_path):
        with pytest.raises(ValueError, match="not a valid Airflow id"):
            run_files.run_dir(DAG_ID, bad, root=str(tmp_path))

    def test_reads_from_s3(self, tmp_path, s3_bucket):
        """The cluster keeps artifacts in S3: the same run folder, uploaded, reads the same."""
        from eagle3 import storage

        local = tmp_path / "a"
        write_run(local)
        root = f"{s3_bucket}/artifacts"
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            storage.put_file(path, storage.join(root, str(path.relative_to(local))))
        s3_run = storage.join(root, "runs", DAG_ID, RUN_ID)
        loaded = run_files.load_run(DAG_ID, RUN_ID, root=root)
        assert loaded["run_dir"] == s3_run
        assert loaded["verify"]["passed"] is False
        assert loaded["extraction"]["stores"][0]["samples"] == 795
        assert ("report", "training_curves.png") in loaded["plots"]
        uri, media = run_files.file_uri(DAG_ID, RUN_ID, "report", "training_curves.png", root=root)
        assert storage.read_bytes(uri)[:8] == b"\x89PNG\r\n\x1a\n" and media == "image/png"


    def test_an_s3_run_reads_through_the_eagle3_s3_connection(self, tmp_path, s3_bucket, s3_endpoint, monkeypatch):
        """Where the endpoint and keys live only in the eagle3_s3 connection (as README says to set them), the
        tab reads an s3 run through it, as the tasks that wrote it did."""
        from eagle3 import storage

        local = tmp_path / "a"
        write_run(local)
        root = f"{s3_bucket}/artifacts"
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            storage.put_file(path, storage.join(root, str(path.relative_to(local))))
        for name in ("EAGLE3_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name, raising=False)
        storage.reset_client()
        assert run_files.load_run(DAG_ID, RUN_ID, root=root)["verify"] is None  # not without the connection
        monkeypatch.setenv("AIRFLOW_CONN_EAGLE3_S3", json.dumps({
            "conn_type": "aws", "login": "testing", "password": "testing",
            "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}))
        monkeypatch.setattr(report_app, "run_info", lambda dag_id, run_id: {"root": root, "state": None,
                                                                            "tasks": None})
        try:
            assert report_app._load(DAG_ID, RUN_ID)["verify"]["passed"] is False
        finally:
            storage.configure_s3(None)

    def test_unreachable_bucket_degrades_to_placeholders(self, s3_endpoint):
        """An S3 error (here: no such bucket) is logged and the sections show as missing, not a 500."""
        loaded = run_files.load_run(DAG_ID, RUN_ID, root="s3://no-such-bucket-eagle3/artifacts")
        assert not loaded["found"] and loaded["verify"] is None and loaded["plots"] == []
        assert "not yet available" in page.render(loaded, base_url="/eagle3")


class TestPage:
    def test_renders_sections_and_flags(self, client):
        r = client.get(f"/runs/{DAG_ID}/{RUN_ID}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        html = r.text
        assert '<tr class="flagged">' in html and "token share 32% vs sample share 7%" in html
        assert "verify: FAILED" in html and "lengths_within_max_seq_len" in html
        assert "79,500" in html  # extraction tokens summed over the index files
        assert "<b>2.61</b>" in html and "previous best draft" in html and "beats the previous best" in html
        assert "not yet available" not in html
        assert 'src="/runs/eagle3_train/manual__2026-11-29T09%3A00%3A00%2B00%3A00/files/report/training_curves.png"' in html

    def test_placeholders_for_a_run_without_files(self, client):
        html = client.get(f"/runs/{DAG_ID}/scheduled__nothing").text
        assert 'id="no-run"' in html
        for section in ("Dataset stats", "Gate verdicts", "Extraction", "Training", "Acceptance", "Plots"):
            assert f"{section} not yet available" in html

    def test_escapes_artifact_text(self, artifacts, client):
        bad = '<script>alert(1)</script>'
        (artifacts / "runs" / DAG_ID / RUN_ID / "merged" / "verify.json").write_text(
            json.dumps({"passed": True, "checks": [{"name": bad, "passed": True}]}))
        html = client.get(f"/runs/{DAG_ID}/{RUN_ID}").text
        assert bad not in html and "&lt;script&gt;" in html

    def test_serves_plots_and_report_html(self, client):
        base = f"/runs/{DAG_ID}/{RUN_ID}/files/report"
        png = client.get(f"{base}/training_curves.png")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content[:8] == b"\x89PNG\r\n\x1a\n"
        assert client.get(f"{base}/report.html").headers["content-type"].startswith("text/html")
        assert client.get(f"{base}/missing.png").status_code == 404
        assert client.get(f"{base}/metrics.jsonl").status_code == 400
        assert client.get(f"/runs/{DAG_ID}/{RUN_ID}/files/merged/verify.json").status_code == 400
        assert client.get(f"/runs/{DAG_ID}/..%2F..%2Fx/files/report/training_curves.png").status_code in (400, 404)

    def test_data_endpoint(self, client):
        data = client.get(f"/runs/{DAG_ID}/{RUN_ID}/data").json()
        assert data["acceptance"]["lossless"] is True
        assert data["plots"][0][0] == "report"

    def test_bad_run_id_is_400(self, client):
        assert client.get(f"/runs/{DAG_ID}/a..b").status_code == 400

    def test_fmt(self):
        assert page.fmt(1234567) == "1,234,567" and page.fmt(0.123456) == "0.1235"
        assert page.fmt(True) == "yes" and page.fmt(None) == "—"


def test_no_token_is_refused(artifacts, monkeypatch):
    """Without the auth override the app refuses a request that carries no Airflow token."""
    monkeypatch.setenv(run_files.ARTIFACTS_ENV, str(artifacts))
    client = TestClient(report_app.app)
    assert client.get(f"/runs/{DAG_ID}/{RUN_ID}").status_code == 401
    assert client.get(f"/runs/{DAG_ID}/{RUN_ID}/files/report/training_curves.png").status_code == 401


def test_plugin_module_does_not_import_fastapi():
    """Every Airflow process (each task run) loads plugins; the app is only built on the first request."""
    code = "import sys; import eagle3_report_plugin; print('fastapi' in sys.modules, 'eagle3_report.app' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(PLUGINS)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_plugin_declares_app_and_dag_run_view():
    import eagle3_report_plugin as plugin

    (spec,) = plugin.Eagle3ReportPlugin.fastapi_apps
    assert spec["app"].app() is report_app.app and spec["url_prefix"] == "/eagle3"
    (view,) = plugin.Eagle3ReportPlugin.external_views
    assert view["destination"] == "dag_run" and view["url_route"] == "eagle3-report"
    assert view["href"].endswith("/eagle3/runs/{DAG_ID}/{RUN_ID}")
