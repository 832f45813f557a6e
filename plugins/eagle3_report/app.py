"""The FastAPI app the plugin mounts at /eagle3 in the Airflow api-server.

A mounted app gets no authentication from Airflow, so every route depends on
`authorized`: it takes the caller's Airflow JWT (Authorization: Bearer, else the
`_token` cookie the Airflow UI sets, which the UI's iframe sends along) and runs
it through the api-server's own checks: `resolve_user_from_token` (the auth
manager's get_user_from_token: signature, expiry, revocation) and
`requires_access_dag("GET", DagAccessEntity.RUN)` (may this user read this DAG's
runs). Missing token → 401, invalid → 403, no access → 403.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from eagle3 import storage

from . import page, run_files

log = logging.getLogger(__name__)


def _token(request: Request) -> str | None:
    """Bearer token if given (an explicit credential wins, as in Airflow's get_user), else the UI cookie."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN)


async def authorized(request: Request) -> Any:
    """The Airflow user behind the request, allowed to read runs of the DAG in the URL."""
    # Imported here: the plugin module is loaded by every Airflow component, only the api-server serves it.
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag, resolve_user_from_token

    user = await resolve_user_from_token(_token(request))
    # The check reads the DAG's team from the DB; keep that off the event loop.
    await run_in_threadpool(requires_access_dag("GET", DagAccessEntity.RUN), request, user)
    return user


app = FastAPI(title="EAGLE-3 report", dependencies=[Depends(authorized)], docs_url=None, redoc_url=None,
              openapi_url=None)


def run_info(dag_id: str, run_id: str) -> dict:
    """The run as Airflow's metadata DB has it: {"root": its ``storage_root`` param when it was triggered with
    one (else None: the default root), "state", "tasks": [{"task_id", "map_index", "state", "name"}]}.

    A run triggered with another storage root (say an s3:// prefix) keeps its artifacts there, so the page
    looks where that run wrote; the task states say what failed and why a section is missing. Nothing is
    known (None, None, None) when the DB cannot be read: the page then shows the files alone.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with create_session() as session:
            found = session.execute(select(DagRun.conf, DagRun.state).where(
                DagRun.dag_id == dag_id, DagRun.run_id == run_id)).first()
            rows = session.execute(select(TI.task_id, TI.map_index, TI.state, TI.rendered_map_index).where(
                TI.dag_id == dag_id, TI.run_id == run_id)).all()
    except SQLAlchemyError as e:
        log.warning("could not read the run %s/%s: %s", dag_id, run_id, e)
        return {"root": None, "state": None, "tasks": None}
    conf, state = found if found else (None, None)
    root = (conf or {}).get("storage_root") if isinstance(conf, dict) else None
    tasks = [{"task_id": t, "map_index": i, "state": str(s) if s else None, "name": n} for t, i, s, n in rows]
    return {"root": root if isinstance(root, str) and root else None, "state": str(state) if state else None,
            "tasks": tasks if found else None}


def configure_storage() -> None:
    """The eagle3_s3 connection's settings for s3:// run folders, as the tasks read and wrote them (none, or an
    unreadable connection: boto3's own settings)."""
    try:
        from airflow.models.connection import Connection

        from operators.hooks import Eagle3StorageHook, s3_settings

        conn = Connection.get_connection_from_secrets(Eagle3StorageHook.default_conn_name)
    except Exception as e:  # not defined (AirflowNotFoundException), or the secrets backend failed
        log.debug("no %s connection for the report tab: %s", "eagle3_s3", e)
        return
    storage.configure_s3(s3_settings(conn))


def run_storage_root(dag_id: str, run_id: str) -> str | None:
    """The run's `storage_root` param, when it was triggered with one (conf); None means the default root."""
    return run_info(dag_id, run_id)["root"]


def _load(dag_id: str, run_id: str) -> dict:
    configure_storage()
    try:
        info = run_info(dag_id, run_id)
        return run_files.load_run(dag_id, run_id, root=info["root"], tasks=info["tasks"], state=info["state"])
    except ValueError as e:
        raise HTTPException(status_code=400, detail=str(e)) from e


@app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse)
def report_page(dag_id: str, run_id: str, request: Request) -> HTMLResponse:
    """One run's report page (the dag_run tab of the Airflow UI shows it in an iframe)."""
    run = _load(dag_id, run_id)
    return HTMLResponse(page.render(run, base_url=request.scope.get("root_path", "")))


@app.get("/runs/{dag_id}/{run_id}/data")
def report_data(dag_id: str, run_id: str) -> JSONResponse:
    """The same content as JSON, for scripts."""
    return JSONResponse(page.json_safe(_load(dag_id, run_id)))


@app.get("/runs/{dag_id}/{run_id}/files/{folder}/{name}")
def report_file(dag_id: str, run_id: str, folder: str, name: str) -> Response:
    """A plot or report file of the run (only flat .png/.html/.json files of the served folders)."""
    configure_storage()
    try:
        run_files.check_id("run_id", run_id)
        uri, media_type = run_files.file_uri(dag_id, run_id, folder, name, root=run_storage_root(dag_id, run_id))
    except ValueError as e:
        raise HTTPException(status_code=400, detail=str(e)) from e
    except FileNotFoundError as e:
        raise HTTPException(status_code=404, detail=str(e)) from e
    return Response(storage.read_bytes(uri), media_type=media_type, headers={"Cache-Control": "no-store"})
