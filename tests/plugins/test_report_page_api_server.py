"""The report page through the real `airflow api-server` (SQLite, simple auth manager), and in headless Chromium.

The api-server is started by the module fixture on 127.0.0.1 and stopped by PID at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from report_run_folder import DAG_ID, PLUGINS, REPO, RUN_ID, write_real_report, write_run

from eagle3.serving.process import free_port

pytestmark = pytest.mark.integration
AIRFLOW = str(Path(sys.executable).parent / "airflow")
ARTIFACTS_DIR = REPO / "test-artifacts"  # gitignored; CI keeps it
ENCODED_RUN_ID = RUN_ID.replace(":", "%3A").replace("+", "%2B")  # as the UI's encodeURIComponent writes it
PAGE = f"/eagle3/runs/{DAG_ID}/{ENCODED_RUN_ID}"
OTHER_RUN_ID = "manual__other_root"
STAND_IN_DAG = """
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import dag


@dag(dag_id="eagle3_train", schedule=None)
def eagle3_train():
    EmptyOperator(task_id="report")


eagle3_train()
"""


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """(base URL, admin token, PNG names of the report) of a running api-server with the plugins folder."""
    home = tmp_path_factory.mktemp("airflow_home_plugin")
    artifacts = home / "artifacts"
    # The run's report folder as eagle3.report writes it, so the screenshots show the real plots.
    plots = write_real_report(write_run(artifacts), artifacts)
    # A stand-in eagle3_train DAG (one empty task) so the UI has a DAG and a run to show the tab on.
    (home / "dags").mkdir()
    (home / "dags" / "eagle3_train.py").write_text(STAND_IN_DAG)
    (home / "passwords.json").write_text(json.dumps({"admin": "admin"}))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__API__WORKERS": "1",
        "EAGLE3_ARTIFACTS": str(artifacts),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    # A second run triggered with its own storage_root (conf), as a user may from the Params form.
    write_run(home / "elsewhere", run_id=OTHER_RUN_ID)
    other_conf = json.dumps({"storage_root": str(home / "elsewhere")})
    for args in (["db", "migrate"], ["dags", "reserialize"], ["dags", "trigger", DAG_ID, "--run-id", RUN_ID],
                 ["dags", "trigger", DAG_ID, "--run-id", OTHER_RUN_ID, "--conf", other_conf]):
        done = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"airflow {' '.join(args)}: " + done.stdout[-3000:] + done.stderr[-3000:]
    port = free_port()
    log = open(home / "api-server.log", "w")
    proc = subprocess.Popen([AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            try:
                if httpx.get(f"{base}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError("api-server did not come up:\n" + (home / "api-server.log").read_text()[-4000:])
            time.sleep(1)
        r = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": "admin"}, timeout=30)
        assert r.status_code in (200, 201), r.text
        yield base, r.json()["access_token"], plots
    finally:
        # Stop the server and its uvicorn worker by the PID (process group) this fixture started.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_unauthenticated_request_is_refused(api_server):
    base, _, _ = api_server
    assert httpx.get(base + PAGE, timeout=30).status_code == 401
    assert httpx.get(f"{base}{PAGE}/files/report/report.html", timeout=30).status_code == 401
    forged = httpx.get(base + PAGE, headers={"Authorization": "Bearer not.a.jwt"}, timeout=30)
    assert forged.status_code in (401, 403)


def test_page_with_bearer_token_and_ui_cookie(api_server):
    base, token, plots = api_server
    r = httpx.get(base + PAGE, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 200, r.text[:2000]
    assert "long_agent" in r.text and "verify: FAILED" in r.text and "2.61" in r.text
    # Plot URLs carry the mount prefix, and the plot is served through the app.
    img = f"{PAGE}/files/report/{plots[0]}"
    assert f'src="{img}"' in r.text
    png = httpx.get(base + img, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    # The Airflow UI's iframe authenticates with the `_token` cookie.
    by_cookie = httpx.get(base + PAGE, cookies={"_token": token}, timeout=60)
    assert by_cookie.status_code == 200 and "long_agent" in by_cookie.text


def test_run_with_its_own_storage_root(api_server):
    """The page looks under the storage_root the run was triggered with, not only EAGLE3_ARTIFACTS."""
    base, token, _ = api_server
    auth = {"Authorization": f"Bearer {token}"}
    data = httpx.get(f"{base}/eagle3/runs/{DAG_ID}/{OTHER_RUN_ID}/data", headers=auth, timeout=60).json()
    assert data["found"] and "/elsewhere/runs/" in data["run_dir"]
    assert data["acceptance"]["tau"] == 2.61
    png = httpx.get(f"{base}/eagle3/runs/{DAG_ID}/{OTHER_RUN_ID}/files/report/training_curves.png", headers=auth,
                    timeout=30)
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"


def test_plugin_is_registered_with_a_dag_run_view(api_server):
    base, token, _ = api_server
    r = httpx.get(f"{base}/api/v2/plugins", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200
    (plugin,) = [p for p in r.json()["plugins"] if p["name"] == "eagle3_report"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/eagle3"
    (view,) = plugin["external_views"]
    assert view["destination"] == "dag_run" and view["href"] == "/eagle3/runs/{DAG_ID}/{RUN_ID}"
    errors = httpx.get(f"{base}/api/v2/plugins/importErrors", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert errors.status_code == 200 and errors.json()["total_entries"] == 0, errors.text


class _AuthProxy(BaseHTTPRequestHandler):
    """Forwards GETs to the api-server with the caller's credential added: Chromium's command line cannot set
    headers or cookies, and the product takes no token in URLs. `cookie=True` sends it as the UI's `_token`
    cookie (what a logged-in browser sends), else as a Bearer header."""

    upstream = ""
    token = ""
    cookie = False
    seen: list[tuple[str, int]] = []

    def do_GET(self):  # noqa: N802 (http.server API)
        auth = {"cookies": {"_token": self.token}} if self.cookie else {
            "headers": {"Authorization": f"Bearer {self.token}"}}
        r = httpx.get(self.upstream + self.path, timeout=60, **auth)
        self.seen.append((self.path, r.status_code))
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("content-type", "application/octet-stream"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    def log_message(self, *args):
        pass


def _screenshot(base: str, token: str, path: str, shot: Path, *, cookie: bool, size: str, wait_ms: int) -> dict:
    """Load base+path in headless Chromium through the proxy; return {requested path: status}."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    handler = type("Proxy", (_AuthProxy,), {"upstream": base, "token": token, "cookie": cookie, "seen": []})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        proc = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={shot}", f"--window-size={size}",
             # Virtual time lets the React UI fetch its data and the iframe load before the shot.
             f"--virtual-time-budget={wait_ms}", f"http://127.0.0.1:{proxy.server_port}{path}"],
            capture_output=True, text=True, timeout=240,
        )
    finally:
        proxy.shutdown()
        proxy.server_close()
        shutil.rmtree(profile, ignore_errors=True)
    assert shot.exists() and shot.stat().st_size > 20_000, proc.stderr[-3000:]
    assert shot.read_bytes()[:4] == b"\x89PNG"
    return dict(handler.seen)


def test_screenshot_of_the_page_in_headless_chromium(api_server):
    base, token, plots = api_server
    seen = _screenshot(base, token, PAGE, ARTIFACTS_DIR / "eagle3_report_page.png", cookie=False,
                       size="1280,1600", wait_ms=5000)
    # Chromium fetched the page and every plot through the app, all authorised.
    assert seen.get(PAGE) == 200, seen
    for name in plots:
        assert seen.get(f"{PAGE}/files/report/{name}") == 200, (name, seen)


def test_screenshot_of_the_dag_run_tab_in_the_airflow_ui(api_server):
    """The real React UI: the run's "EAGLE-3 report" tab loads the page in an iframe, authenticated by the cookie."""
    base, token, plots = api_server
    tab = f"/dags/{DAG_ID}/runs/{ENCODED_RUN_ID}/plugin/eagle3-report"
    seen = _screenshot(base, token, tab, ARTIFACTS_DIR / "eagle3_report_ui_tab.png", cookie=True,
                       size="1400,1000", wait_ms=20000)
    assert seen.get(tab) == 200, seen
    assert seen.get("/api/v2/plugins") == 200, seen  # the UI learnt the tab from the plugin registry
    assert seen.get(PAGE) == 200, seen  # the iframe, with {DAG_ID}/{RUN_ID} filled in by the UI
    assert seen.get(f"{PAGE}/files/report/{plots[0]}") == 200, seen
