"""docker-compose.yaml validated by Debian's docker-compose v1 (`config` needs no Docker engine),
plus the compose init script run for real against a SQLite Airflow home."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer", "airflow-worker", "airflow-worker-gpu0", "airflow-worker-gpu1"}
SERVICES = AIRFLOW_SERVICES | {"postgres", "redis", "minio", "minio-init"}


def _make_env(tmp_path: Path, gpus: int = 2) -> tuple[Path, dict[str, str]]:
    text = subprocess.run(["bash", str(REPO / "docker/make-env.sh"), str(gpus)], check=True,
                          capture_output=True, text=True).stdout
    path = tmp_path / "cluster.env"
    path.write_text(text)
    return path, dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _compose_config(env_file: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("docker-compose")
    if not binary:
        pytest.skip("Debian's docker-compose (v1) is not installed: apt-get install -y docker-compose")
    # Only the env file's values: a developer's shell variables must not leak into the check.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    return subprocess.run([binary, "--env-file", str(env_file), "-f", str(COMPOSE), "config"],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> tuple[dict, dict[str, str]]:
    env_file, values = _make_env(tmp_path_factory.mktemp("compose"))
    proc = _compose_config(env_file)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout), values


class TestComposeConfig:
    def test_topology(self, config):
        services = config[0]["services"]
        assert set(services) == SERVICES
        commands = {name: " ".join(s["command"]) if isinstance(s.get("command"), list) else s.get("command")
                    for name, s in services.items()}
        assert commands["airflow-apiserver"] == "api-server"
        assert commands["airflow-scheduler"] == "scheduler"
        assert commands["airflow-dag-processor"] == "dag-processor"
        assert commands["airflow-triggerer"] == "triggerer"
        assert services["airflow-apiserver"]["ports"][0]["target"] == 8080

    def test_queues(self, config):
        services = config[0]["services"]
        assert services["airflow-worker"]["command"] == "celery worker --queues default"
        for gpu in ("airflow-worker-gpu0", "airflow-worker-gpu1"):
            assert services[gpu]["command"] == "celery worker --queues gpu --concurrency 1"

    def test_gpu_device_reservations(self, config):
        services = config[0]["services"]
        ids = []
        for gpu in ("airflow-worker-gpu0", "airflow-worker-gpu1"):
            (device,) = services[gpu]["deploy"]["resources"]["reservations"]["devices"]
            assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
            ids += device["device_ids"]
        assert ids == ["0", "1"]  # one GPU per worker, none shared
        assert "deploy" not in services["airflow-worker"]
        assert services["airflow-worker-gpu1"]["profiles"] == ["multi-gpu"]

    def test_shared_secrets_and_celery(self, config):
        services, values = config
        for name in AIRFLOW_SERVICES:
            env = services["services"][name]["environment"]
            assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == values["AIRFLOW_JWT_SECRET"], name
            assert env["AIRFLOW__API__SECRET_KEY"] == values["AIRFLOW_SECRET_KEY"], name
            assert env["AIRFLOW__CORE__FERNET_KEY"] == values["AIRFLOW_FERNET_KEY"], name
            assert env["AIRFLOW__CORE__EXECUTOR"] .endswith("CeleryExecutor"), name
            assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:"), name
            assert values["POSTGRES_PASSWORD"] in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
            assert env["EAGLE3_ARTIFACTS"] == "s3://eagle3/artifacts", name
            assert env["EAGLE3_S3_ENDPOINT_URL"] == "http://minio:9000", name
        assert services["services"]["minio"]["environment"]["MINIO_ROOT_PASSWORD"] == values["S3_SECRET_KEY"]

    def test_one_image_from_the_repo_and_a_gpu_image_on_top(self, config):
        services = config[0]["services"]
        cpu = {services[n]["image"] for n in AIRFLOW_SERVICES if "gpu" not in n}
        assert cpu == {"eagle3-airflow:latest"}
        for n in AIRFLOW_SERVICES - {"airflow-worker-gpu0", "airflow-worker-gpu1"}:
            assert services[n]["build"]["dockerfile"] == "docker/Dockerfile"
            assert Path(services[n]["build"]["context"]) == REPO
        gpu = services["airflow-worker-gpu0"]
        assert gpu["image"] == "eagle3-airflow-gpu:latest"
        assert gpu["build"]["dockerfile"] == "docker/Dockerfile.gpu"
        assert gpu["build"]["args"]["BASE_IMAGE"] == "eagle3-airflow:latest"
        assert "sglang==" in (REPO / "docker/Dockerfile.gpu").read_text()

    def test_init_order_pools_connections_and_bucket(self, config):
        services, values = config
        s = services["services"]
        init = s["airflow-init"]
        assert init["command"] == ["/opt/eagle3/docker/compose-init.sh"]
        assert init["environment"]["GPU_COUNT"] == "2"
        assert init["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
        for name in AIRFLOW_SERVICES - {"airflow-init"}:
            assert s[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully", name
        assert "mc mb --ignore-existing" in " ".join(s["minio-init"]["command"])
        assert s["minio-init"]["environment"]["S3_BUCKET"] == values["S3_BUCKET"]

    def test_missing_secret_is_refused_with_its_name(self, tmp_path):
        env_file, values = _make_env(tmp_path)
        env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items() if k != "AIRFLOW_JWT_SECRET"))
        proc = _compose_config(env_file)
        assert proc.returncode != 0 and "set AIRFLOW_JWT_SECRET in .env" in proc.stderr


class TestDockerfiles:
    def test_copied_paths_exist_and_venv_is_ignored(self):
        for dockerfile in ("docker/Dockerfile", "docker/Dockerfile.gpu"):
            for line in (REPO / dockerfile).read_text().splitlines():
                if line.startswith("COPY"):
                    src = line.split()[-2]
                    assert (REPO / src).exists(), f"{dockerfile}: COPY source {src} missing"
            ignore = (REPO / f"{dockerfile}.dockerignore").read_text().splitlines()
            assert ".venv/" in ignore and ".git/" in ignore

    def test_make_env_refuses_a_bad_gpu_count(self):
        proc = subprocess.run(["bash", str(REPO / "docker/make-env.sh"), "two"], capture_output=True, text=True)
        assert proc.returncode == 2 and "GPU_COUNT" in proc.stderr


@pytest.mark.integration
def test_init_script_creates_pools_connections_and_passwords(tmp_path):
    """docker/compose-init.sh run as the airflow-init service runs it, on a SQLite home instead of postgres."""
    airflow_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{airflow_bin}{os.pathsep}{os.environ['PATH']}",
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(tmp_path / "shared/passwords.json"),
        "AIRFLOW_ADMIN_PASSWORD": "pw-123",
        "EAGLE3_REPO": str(REPO),
        "GPU_COUNT": "3",
        "S3_ENDPOINT_URL": "http://minio:9000",
        "S3_ACCESS_KEY": "key",
        "S3_SECRET_KEY": "secret",
    }
    run = subprocess.run(["bash", str(REPO / "docker/compose-init.sh")], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    # One interpreter reads what the script left in the DB, through Airflow's own models.
    probe = """
import json
from airflow.models import Connection, Pool
from airflow.utils.session import create_session
with create_session() as session:
    gpu = session.query(Pool).filter(Pool.pool == "gpu").one()
    conns = {c.conn_id: {"type": c.conn_type, "host": c.host, "login": c.login, "extra": c.extra_dejson}
             for c in session.query(Connection)}
print(json.dumps({"gpu_slots": gpu.slots, "connections": conns}))
"""
    out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True,
                         timeout=300).stdout
    state = json.loads(out.strip().splitlines()[-1])
    assert state["gpu_slots"] == 3
    conns = state["connections"]
    for conn_id in ("eagle3_s3", "aws_default"):
        assert conns[conn_id]["type"] == "aws" and conns[conn_id]["login"] == "key"
        assert conns[conn_id]["extra"]["endpoint_url"] == "http://minio:9000"
    assert conns["eagle3_openai"]["host"] == "http://sglang:30000/v1"
    assert json.loads((tmp_path / "shared/passwords.json").read_text()) == {"admin": "pw-123"}
