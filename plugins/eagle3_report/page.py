"""Render one run (the dict from run_files.load_run) as a self-contained HTML page.

What the page says is eagle3.report.view's, the same texts and tables as report.html; the template only lays
them out (and adds what only the UI has: the run's state, the plot files, a link to report.html).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from eagle3.report.summary import fmt  # the one formatter of both pages
from eagle3.report.view import sections

_TEMPLATES = Path(__file__).resolve().parent / "templates"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = fmt
    return env


def render(run: dict, base_url: str) -> str:
    """The page; `base_url` is where the app is mounted (e.g. /eagle3), used for the plot URLs."""
    prefix = f"{base_url.rstrip('/')}/runs/{quote(run['dag_id'], safe='')}/{quote(run['run_id'], safe='')}/files"
    return _env().get_template("report.html.j2").render(
        run=run, v=sections(run, run.get("task_states"), run.get("state")), files_url=prefix,
        report_json=json.dumps(run["report"], indent=2, default=str)[:20000] if run["report"] else "",
    )


def json_safe(value: Any) -> Any:
    """The run dict with tuples as lists and unknown objects as strings."""
    return json.loads(json.dumps(value, default=str))
