"""`make airflow`, the README's way to the UI, started the way the README says: from a fresh shell, no venv
activated, nothing on PATH but the system's (conftest.py). `airflow standalone` starts its components by the
name `airflow`, so this failed with "No such file or directory: 'airflow'" until the Makefile put the venv's
bin on PATH. Then what the UI's pages ask the api-server for: the Graph's and the Grid's structure answered
HTTP 500 ("A cyclic dependency occurred in dag") until no task group sat on both sides of a task."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytestmark = [pytest.mark.integration]


def _get(base: str, path: str, token: str) -> tuple[int, str]:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_make_airflow_from_a_fresh_shell(airflow_ui):
    token = airflow_ui.token()  # logged in as the README says: user admin, the generated password
    status, plugins = _get(airflow_ui.base, "/api/v2/plugins", token)
    views = [v for p in json.loads(plugins)["plugins"] for v in p.get("external_views", [])]
    assert any(v["name"] == "EAGLE-3 report" and v["destination"] == "dag_run" for v in views), plugins
    status, dags = _get(airflow_ui.base, "/api/v2/dags", token)
    assert "eagle3_train" in {d["dag_id"] for d in json.loads(dags)["dags"]}, dags
    status, details = _get(airflow_ui.base, "/api/v2/dags/eagle3_train/details", token)
    params = json.loads(details)["params"]
    assert "evaluate_backend" in params and "regenerate_restart" in params, sorted(params)  # the form's fields
    # The form's defaults name the demo corpus `make airflow` wrote, under the storage root it uses.
    manifest = params["manifest"]["value"]
    assert manifest == str(airflow_ui.artifacts / "demo" / "manifest.yaml"), manifest
    assert (airflow_ui.artifacts / "demo" / "manifest.yaml").exists()
    assert params["storage_root"]["value"] == str(airflow_ui.artifacts)


def test_graph_and_grid_structure_through_the_api_server(airflow_ui):
    """The calls the Graph and Grid views make (their UI routes), each answered without an HTTP error."""
    token = airflow_ui.token()
    calls = {
        "graph": "/ui/structure/structure_data?dag_id=eagle3_train&external_dependencies=false",
        "grid structure": "/ui/grid/structure/eagle3_train?include_upstream=false&include_downstream=false"
                          "&limit=10&order_by=-run_after",
        "grid runs": "/ui/grid/runs/eagle3_train?limit=10&order_by=-run_after",
        "dag": "/api/v2/dags/eagle3_train",
        "tasks": "/api/v2/dags/eagle3_train/tasks",
    }
    answers = {}
    for name, path in calls.items():
        status, body = _get(airflow_ui.base, path, token)
        assert status == 200, (name, status, body[:2000])
        answers[name] = json.loads(body)
    nodes = {n["id"] for n in answers["graph"]["nodes"]}
    assert {"discover", "stats", "verify", "report", "outcome"} <= nodes, nodes
    edges = {(e["source_id"], e["target_id"]) for e in answers["graph"]["edges"]}
    assert ("report", "outcome") in edges, edges
    rows = {n["id"] for n in answers["grid structure"]}
    assert {"discover", "extract", "train", "evaluate", "outcome"} <= rows, rows
