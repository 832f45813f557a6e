"""Hooks: the only code that reads eagle3's Airflow connections.

``Eagle3StorageHook`` turns an aws-type connection (login/password = key/secret, extra
``endpoint_url``/``region_name`` as in the amazon provider) into eagle3.storage settings;
``OpenAIEndpointHook`` turns a connection (host = base URL, password = key) into the
regenerate stage's endpoint. Nothing is read at DAG parse time (cached properties), and
nothing is written to this process's environment: settings reach a child process through
its own env only.
"""

from __future__ import annotations

from functools import cached_property

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException


def _connection(conn_id: str | None):
    if not conn_id:
        return None
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def s3_settings(conn):
    """eagle3.storage.S3Settings of an aws-type connection (None: no connection, boto3's own settings)."""
    if conn is None:
        return None
    from eagle3.storage import S3Settings

    extra = conn.extra_dejson or {}
    return S3Settings(endpoint_url=extra.get("endpoint_url") or None, access_key=conn.login or None,
                      secret_key=conn.password or None, region=extra.get("region_name") or None)


class Eagle3StorageHook(BaseHook):
    """S3 settings for ``s3://`` artifact paths. A missing connection means: use what boto3 finds itself.

    :param conn_id: an aws-type Airflow connection.
    """

    conn_name_attr = "conn_id"
    default_conn_name = "eagle3_s3"
    conn_type = "aws"
    hook_name = "eagle3 artifact storage"

    def __init__(self, conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id

    @cached_property
    def settings(self):
        """eagle3.storage.S3Settings, or None when the connection does not exist."""
        return s3_settings(_connection(self.conn_id))

    def child_env(self) -> dict[str, str]:
        return self.settings.env() if self.settings is not None else {}


class OpenAIEndpointHook(BaseHook):
    """An OpenAI-compatible server for regeneration (vLLM, SGLang, OpenRouter, llama.cpp).

    :param conn_id: a connection whose host is the base URL and whose password is the API key.
    """

    conn_name_attr = "conn_id"
    default_conn_name = "eagle3_openai"
    conn_type = "http"
    hook_name = "eagle3 OpenAI-compatible endpoint"

    def __init__(self, conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id

    @cached_property
    def connection(self):
        conn = _connection(self.conn_id)
        if conn is None:
            from eagle3.errors import InputError

            raise InputError(f"regenerate_backend=openai needs the Airflow connection {self.conn_id!r} "
                             "(host = the server's base URL, password = its API key)")
        return conn

    def child_env(self) -> dict[str, str]:
        """EAGLE3_OPENAI_BASE_URL / EAGLE3_OPENAI_API_KEY for the regenerate child (never its command line)."""
        from eagle3.regenerate.config import API_KEY_ENV, BASE_URL_ENV

        env = {BASE_URL_ENV: self.connection.host or ""}
        if self.connection.password:
            env[API_KEY_ENV] = self.connection.password
        return env
