"""An isolated AIRFLOW_HOME (SQLite, no examples) for the Airflow tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    env.update(extra)
    return env


def airflow(home: Path, *args: str, env: dict | None = None, timeout: int = 600, check: bool = True):
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), *args], env=env or airflow_env(home),
        capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"airflow {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> Path:
    """A migrated SQLite Airflow home with the repo's pools."""
    home = tmp_path_factory.mktemp("airflow_home")
    airflow(home, "db", "migrate")
    airflow(home, "pools", "import", str(REPO / "pools.json"))
    return home
