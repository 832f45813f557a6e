"""AirflowPlugin: the EAGLE-3 report page as a tab of every DAG run in the Airflow UI.

`fastapi_apps` mounts the page's app in the api-server at /eagle3;
`external_views` with destination "dag_run" adds the "EAGLE-3 report" tab to the
run page, which shows `href` in an iframe. The UI fills `{DAG_ID}` and `{RUN_ID}`
in `href` (URI-encoded) for dag_run destinations; `url_route` makes it render
inside the UI instead of opening a new tab.
"""

from __future__ import annotations

from urllib.parse import urlparse

from typing import Any

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/eagle3"
# When the api-server is served below a sub-path ([api] base_url), the iframe URL must carry it.
_BASE_PATH = urlparse(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")


class ReportApp:
    """ASGI app that builds the report's FastAPI app on its first request.

    Every Airflow process loads the plugins (the task runner does, for each task), but only the api-server serves
    requests; importing FastAPI costs about 1 s on a busy 2-core machine, so the other processes skip it.
    """

    _app: Any = None

    async def __call__(self, scope, receive, send) -> None:
        await self.app()(scope, receive, send)

    @classmethod
    def app(cls):
        if cls._app is None:
            from eagle3_report.app import app

            cls._app = app
        return cls._app


class Eagle3ReportPlugin(AirflowPlugin):
    name = "eagle3_report"
    fastapi_apps = [{"app": ReportApp(), "url_prefix": URL_PREFIX, "name": "EAGLE-3 report"}]
    external_views = [{
        "name": "EAGLE-3 report",
        "href": f"{_BASE_PATH}{URL_PREFIX}/runs/{{DAG_ID}}/{{RUN_ID}}",
        "url_route": "eagle3-report",
        "destination": "dag_run",
    }]
