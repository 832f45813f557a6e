"""The base of every eagle3 operator: storage credentials, the retry policy, light XCom.

An operator's `execute` turns rendered template fields into one call of the
core library and returns that call's small JSON summary (XCom carries paths
and summaries only; large values over XCom have blocked heartbeats).
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.sdk import BaseOperator

from operators.retry import EAGLE3_RETRY_POLICY

S3_CONN_ID = "eagle3_s3"


def storage_env(conn_id: str = S3_CONN_ID) -> dict[str, str]:
    """Environment for eagle3.storage from an Airflow connection (aws type).

    login/password are the access key and secret; extra `endpoint_url` and
    `region_name` as in the amazon provider. A missing connection means the
    worker's own environment is used.
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return {}
    env: dict[str, str] = {}
    if conn.login:
        env["AWS_ACCESS_KEY_ID"] = conn.login
    if conn.password:
        env["AWS_SECRET_ACCESS_KEY"] = conn.password
    extra = conn.extra_dejson or {}
    if extra.get("endpoint_url"):
        env["EAGLE3_S3_ENDPOINT_URL"] = extra["endpoint_url"]
    if extra.get("region_name"):
        env["AWS_DEFAULT_REGION"] = extra["region_name"]
    return env


class Eagle3Operator(BaseOperator):
    """Base of the eagle3 stage operators.

    :param s3_conn_id: Airflow connection (aws type) holding the S3 endpoint and
        credentials for `s3://` paths; ignored when it does not exist.
    """

    ui_color = "#e8f1ff"

    def __init__(self, *, s3_conn_id: str = S3_CONN_ID, **kwargs: Any) -> None:
        kwargs.setdefault("retry_policy", EAGLE3_RETRY_POLICY)
        super().__init__(**kwargs)
        self.s3_conn_id = s3_conn_id

    def stage_env(self) -> dict[str, str]:
        """Apply the storage credentials to this process and return them for subprocesses."""
        env = storage_env(self.s3_conn_id)
        if env:
            os.environ.update(env)
            from eagle3 import storage

            storage.reset_client()
        return env

    @staticmethod
    def summary(result: Any) -> Any:
        """Keep XCom small: refuse to push anything over 64 KB."""
        text = json.dumps(result, default=str)
        if len(text) > 65536:
            raise ValueError(f"summary of {len(text)} bytes is too large for XCom; push paths, not data")
        return json.loads(text)
