"""The docker-compose topology as plain processes: Airflow on PostgreSQL with the
CeleryExecutor on Redis, plus a moto S3 endpoint. Every process is started here
and stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from eagle3.serving.process import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not up after {timeout}s")


class Cluster:
    """Start with `start()`, stop with `stop()`; logs go to `home/logs-*.txt`."""

    def __init__(self, home: Path, s3_endpoint: str, extra_env: dict[str, str] | None = None):
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.db = f"eagle3_it_{uuid.uuid4().hex[:8]}"
        self.api_port = free_port()
        self.redis_db = 7
        self.procs: dict[str, subprocess.Popen] = {}
        self.password = "admin-" + uuid.uuid4().hex[:8]
        (home / "passwords.json").write_text(json.dumps({"admin": self.password}))
        pg = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{self.db}"
        self.base_url = f"http://127.0.0.1:{self.api_port}"
        conn = {"conn_type": "aws", "login": "testing", "password": "testing",
                "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__EXECUTOR": "airflow.providers.celery.executors.celery_executor.CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": pg,
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:6379/{self.redis_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql://postgres@127.0.0.1:5432/{self.db}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW_CONN_EAGLE3_S3": json.dumps(conn),
            "PYTHONPATH": str(REPO),
            **(extra_env or {}),
        }

    def _run(self, *args: str, timeout: int = 600) -> None:
        subprocess.run([str(BIN / "airflow"), *args], env=self.env, check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.home / f"logs-{name}.txt", "w")
        self.procs[name] = subprocess.Popen([str(BIN / "airflow"), *args], env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> None:
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", f"CREATE DATABASE {self.db}"],
                       check=True, capture_output=True)
        subprocess.run(["redis-cli", "-n", str(self.redis_db), "FLUSHDB"], check=True, capture_output=True)
        self._run("db", "migrate")
        self._run("pools", "import", str(REPO / "pools.json"))
        self._spawn("api-server", "api-server", "--host", "127.0.0.1", "--port", str(self.api_port))
        self._spawn("scheduler", "scheduler")
        self._spawn("dag-processor", "dag-processor")
        self._spawn("worker", "celery", "worker", "--queues", "default,gpu", "--concurrency", "2")
        wait_http(f"{self.base_url}/api/v2/version", 180, self.procs["api-server"])

    def token(self) -> str:
        r = httpx.post(f"{self.base_url}/auth/token", json={"username": "admin", "password": self.password}, timeout=60)
        r.raise_for_status()
        return r.json()["access_token"]

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-c",
                        f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)"], capture_output=True)

    def logs(self, name: str, tail: int = 3000) -> str:
        p = self.home / f"logs-{name}.txt"
        return p.read_text()[-tail:] if p.exists() else ""
