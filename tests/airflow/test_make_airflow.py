"""`make airflow`, the README's way to the UI, started the way the README says: from a fresh shell, no venv
activated, nothing on PATH but the system's. `airflow standalone` starts its components by the name `airflow`,
so this failed with "No such file or directory: 'airflow'" until the Makefile put the venv's bin on PATH."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from eagle3.serving.process import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration]


def _health(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def _post_json(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _get(port: int, path: str, token: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_make_airflow_from_a_fresh_shell(tmp_path):
    port = free_port()
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__API__PORT": str(port),
           "EAGLE3_ARTIFACTS": str(tmp_path / "artifacts")}
    log = tmp_path / "standalone.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", "-C", str(REPO), "airflow"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline, health = time.time() + 300, None
        components = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        while time.time() < deadline and proc.poll() is None:
            health = _health(port)
            if health and all((health.get(c) or {}).get("status") == "healthy" for c in components):
                break
            time.sleep(2)
        text = log.read_text(errors="replace")
        assert "No such file or directory: 'airflow'" not in text, text[-3000:]
        assert proc.poll() is None, f"make airflow exited {proc.returncode}:\n{text[-3000:]}"
        assert health and all(health[c]["status"] == "healthy" for c in components), (health, text[-3000:])
        passwords = json.loads((tmp_path / "home" / "simple_auth_manager_passwords.json.generated").read_text())
        # Log in as the README says (user admin, the generated password), then reach what the UI shows.
        token = _post_json(port, "/auth/token", {"username": "admin", "password": passwords["admin"]})["access_token"]
        plugins = _get(port, "/api/v2/plugins", token)
        views = [v for p in json.loads(plugins)["plugins"] for v in p.get("external_views", [])]
        assert any(v["name"] == "EAGLE-3 report" and v["destination"] == "dag_run" for v in views), plugins
        dags = json.loads(_get(port, "/api/v2/dags", token))
        assert "eagle3_train" in {d["dag_id"] for d in dags["dags"]}, dags
        params = json.loads(_get(port, "/api/v2/dags/eagle3_train/details", token))["params"]
        assert "evaluate_backend" in params, sorted(params)  # the trigger form's fields
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
