"""`make airflow` as the README starts it (a fresh shell: no venv on PATH), once for the UI tests.

The server runs with a planted failure (tests/airflow/plant: evaluate's lossless gate fails after report.json is
written), so a run triggered from the form shows what a failed gate looks like in the UI. Every process it
starts is stopped by PID at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagle3.serving.process import free_port
from tests.evaluate.server_processes import alive

REPO = Path(__file__).resolve().parents[2]
PLANT = REPO / "tests" / "airflow" / "plant"
COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")


@dataclass
class AirflowUI:
    base: str
    password: str
    home: Path
    artifacts: Path
    log: Path

    _token: str | None = None

    def token(self) -> str:
        """A JWT for admin (one per test module: tokens last hours)."""
        if self._token is None:
            self._token = self._login()
        return self._token

    def get(self, path: str):
        """GET an api-server route as admin. The api-server shares 2 cores with the run's tasks: a slow answer is
        waited for, a timed-out one asked again."""
        req = urllib.request.Request(f"{self.base}{path}", headers={"Authorization": f"Bearer {self.token()}"})
        for attempt in range(3):
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return json.loads(r.read())
            except TimeoutError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _login(self) -> str:
        req = urllib.request.Request(f"{self.base}/auth/token", method="POST",
                                     data=json.dumps({"username": "admin", "password": self.password}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["access_token"]


def health(base: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (standalone's components, their workers and task processes)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop(pids: list[int], grace_s: float = 30) -> None:
    """SIGTERM these processes (by PID), SIGKILL those still there after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace_s
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.5)


@contextlib.contextmanager
def started_airflow(tmp: Path, plant: str | None = "lossless_gate", start_s: float = 420):
    """`make airflow` from a fresh shell with its home and artifacts under ``tmp``, until every component is
    healthy; ``plant`` names a planted failure (tests/airflow/plant), None runs the product as shipped."""
    port = free_port()
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "AIRFLOW_HOME": str(tmp / "home"), "AIRFLOW__API__PORT": str(port),
           # where task processes reach the execution API (its default names port 8080)
           "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}", "EAGLE3_ARTIFACTS": str(tmp / "artifacts")}
    if plant:
        env.update(PYTHONPATH=str(PLANT), EAGLE3_TEST_PLANT=plant)
    log = tmp / "standalone.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", "-C", str(REPO), "airflow"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    ui = AirflowUI(base, "", tmp / "home", tmp / "artifacts", log)
    try:
        deadline, state = time.time() + start_s, None
        while time.time() < deadline and proc.poll() is None:
            state = health(base)
            if state and all((state.get(c) or {}).get("status") == "healthy" for c in COMPONENTS):
                break
            time.sleep(2)
        text = log.read_text(errors="replace")
        assert "No such file or directory: 'airflow'" not in text, text[-3000:]
        assert proc.poll() is None, f"make airflow exited {proc.returncode}:\n{text[-3000:]}"
        assert state and all(state[c]["status"] == "healthy" for c in COMPONENTS), (state, text[-3000:])
        ui.password = json.loads((tmp / "home" / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        yield ui
    finally:
        # standalone's components leave make's process group, and outlive standalone when it is stopped
        # first (the api-server then keeps the port): stop the whole tree, by PID, collected beforehand.
        stop([proc.pid, *descendants(proc.pid)])
        proc.wait(timeout=30)


def wait_for_run(ui: AirflowUI, run_id: str, timeout_s: float = 900, dag_id: str = "eagle3_train",
                 poll_s: float = 5) -> tuple[str, dict]:
    """The run's final state ("success"/"failed", or its state at the timeout) and each task's state."""
    quoted = urllib.parse.quote(run_id, safe="")
    deadline, state = time.time() + timeout_s, None
    while time.time() < deadline:
        state = ui.get(f"/api/v2/dags/{dag_id}/dagRuns/{quoted}")["state"]
        if state in ("success", "failed"):
            break
        time.sleep(poll_s)
    tis = ui.get(f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances?limit=1000")["task_instances"]
    return state, {(t["task_id"] if t["map_index"] < 0 else f"{t['task_id']}[{t['map_index']}]"): t["state"]
                   for t in tis}


@pytest.fixture(scope="module")
def airflow_ui(tmp_path_factory) -> AirflowUI:
    with started_airflow(tmp_path_factory.mktemp("make-airflow")) as ui:
        yield ui
