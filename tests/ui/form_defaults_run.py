"""The run a newcomer gets from the trigger form with nothing changed: `make airflow` from a fresh shell and home,
the DAG triggered through the api-server with ``conf {}`` (the form's defaults, which are the demo's), watched
through the real scheduler to its end. Not a test (it takes the demo's time and more: every task runs as its
own process next to the UI's); run it by hand:

    .venv/bin/python -m tests.ui.form_defaults_run [--timeout-min 120]

It prints each task's state and duration, writes test-artifacts/ui/form_defaults_run.json, and exits 0 only
when the run succeeded and its state is its tasks' verdict (no failed or upstream_failed task in a green run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

from tests.ui.conftest import REPO, AirflowUI, started_airflow, wait_for_run

DAG = "eagle3_train"
OUT = REPO / "test-artifacts" / "ui" / "form_defaults_run.json"


def _send(ui: AirflowUI, method: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{ui.base}{path}", method=method, data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {ui.token()}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _seconds(start: str | None, end: str | None) -> float | None:
    if not (start and end):
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-min", type=float, default=120)
    ap.add_argument("--keep", action="store_true", help="keep the temporary home and artifacts (printed)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="form-defaults-"))
    t0 = time.time()
    with started_airflow(tmp, plant=None) as ui:
        print(f"make airflow healthy after {time.time() - t0:.0f} s; home {tmp}", flush=True)
        _send(ui, "PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
        run = _send(ui, "POST", f"/api/v2/dags/{DAG}/dagRuns", {"logical_date": None, "conf": {}})
        run_id, t1 = run["dag_run_id"], time.time()
        print(f"triggered {run_id} with conf {{}}", flush=True)
        state, tis = wait_for_run(ui, run_id, timeout_s=args.timeout_min * 60, dag_id=DAG, poll_s=15)
        quoted = urllib.parse.quote(run_id, safe="")
        rows = ui.get(f"/api/v2/dags/{DAG}/dagRuns/{quoted}/taskInstances?limit=1000")["task_instances"]
    wall = time.time() - t1
    tasks = sorted(({"task": t["task_id"] + (f"[{t['map_index']}]" if t["map_index"] >= 0 else ""),
                     "state": t["state"], "seconds": _seconds(t.get("start_date"), t.get("end_date")),
                     "try_number": t.get("try_number")} for t in rows), key=lambda r: r["task"])
    for r in tasks:
        secs = f"{r['seconds']:.0f} s" if r["seconds"] is not None else "-"
        print(f"  {r['task']:<40} {r['state'] or '-':<16} {secs:>8}  try {r['try_number']}")
    bad = sorted(k for k, v in tis.items() if v in ("failed", "upstream_failed"))
    consistent = (state == "success") == (not bad)
    print(f"run {state} after {wall / 60:.1f} min; failed tasks: {bad or 'none'}; state matches tasks: {consistent}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"run_id": run_id, "state": state, "minutes": round(wall / 60, 1), "tasks": tasks,
                               "failed": bad, "state_matches_tasks": consistent}, indent=2))
    if args.keep:
        print(f"kept {tmp}")
    else:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if state == "success" and consistent else 1


if __name__ == "__main__":
    sys.exit(main())
