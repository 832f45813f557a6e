"""DAG Params whose default and description come from a stage Config field (the one owner of both).

    "lr": config_param(TrainConfig, "lr", title="Learning rate", exclusiveMinimum=0)

The JSON-schema type follows the field's annotation, so the trigger form refuses a value of
the wrong type, and the DAG renders templates as native objects so the value reaches the
Config with the type the form checked.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from airflow.sdk import Param

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object"}


def json_type(tp) -> str | list[str]:
    """The JSON-schema ``type`` of a Config field annotation."""
    nullable = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(tp))
        tp = args[0]
    name = "array" if typing.get_origin(tp) in (tuple, list) else _JSON_TYPES[typing.get_origin(tp) or tp]
    return ["null", name] if nullable else name


def config_param(cls: type, field: str, *, default: Any = None, **schema: Any) -> Param:
    """A Param for ``cls.field``: its default (unless ``default`` is given), its docstring, its type."""
    from eagle3.config import default as field_default
    from eagle3.config import field_docs

    value = field_default(cls, field) if default is None else default
    if isinstance(value, tuple):
        value = list(value)
    schema.setdefault("type", json_type(typing.get_type_hints(cls)[field]))
    schema.setdefault("description", field_docs(cls).get(field, ""))
    return Param(value, **schema)
