"""DAG Params whose default and description come from a stage Config field (the one owner of both), and the
adaptation of every Param to what Airflow's trigger form does with its JSON schema.

    "lr": config_param(TrainConfig, "lr", title="Learning rate", exclusiveMinimum=0)
    PARAMS = form_params({...}, defaults=eagle3.demo.settings.PARAMS)

The JSON-schema type follows the field's annotation, so the server refuses a value of the wrong type, and
the DAG renders templates as native objects so the value reaches the Config with the type that was checked.

What Airflow 3.3's trigger form does with a schema (checked in its UI code and in headless Chromium), and
what ``form_params`` does about it:

- ``minimum``/``maximum`` on a number field make its input clamp the value on blur, silently (-5 becomes
  16), and nothing checks integer-ness or ``exclusiveMinimum``. The bounds therefore move into ``allOf``,
  which the form does not read and the server still checks: a value out of range, or 1.5 for an integer,
  is refused at trigger time with the server's message naming the field, shown in the trigger dialog,
  before any run exists. Each bound is also written into the field's help text.
- ``description`` is shown as plain text; ``description_md`` is rendered as Markdown. Config docstrings
  use RST literals (````hf````), which become Markdown code (```hf```).
- An enum holding None shows the option as "null"; ``values_display`` gives it a label.
- An array of enum strings is a free text box unless the array has ``examples``: then it is a multi-select.
- A field whose type excludes null is "required": emptied, it blocks the Trigger button. An emptied list
  field sends null, so a list that may be empty also takes null (templates read ``params.x or []``).
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from airflow.sdk import Param

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object"}
_BOUNDS = {"minimum": "at least {}", "exclusiveMinimum": "more than {}", "maximum": "at most {}",
           "exclusiveMaximum": "less than {}"}
_KIND = {"integer": "An integer", "number": "A number"}


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


def markdown(text: str) -> str:
    """RST inline literals (````x````) as Markdown code (```x```)."""
    return re.sub(r"``([^`]+)``", r"`\1`", text or "")


def form_param(param: Param, default: Any = ...) -> Param:
    """``param`` as the trigger form should show it (see the module doc); ``default`` replaces its default."""
    schema = dict(param.schema)
    value = param.value if default is ... else default
    md = markdown(param.description or schema.pop("description_md", "") or "")
    types_ = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    if "null" in types_:  # the form shows a null as an empty field
        md = re.sub(r"\bNone:", "empty:", md)
    bounds = {k: schema.pop(k) for k in list(_BOUNDS) if k in schema}
    if bounds:
        schema["allOf"] = [*schema.get("allOf", []), bounds]
        kind = next((_KIND[t] for t in types_ if t in _KIND), "A value")
        md = (md.rstrip(".") + ". " if md else "") + kind + ", " + " and ".join(
            _BOUNDS[k].format(v) for k, v in bounds.items()) + "."
    elif "integer" in types_:
        md = (md.rstrip(".") + ". " if md else "") + "An integer."
    if "array" in types_ and "null" not in types_ and not schema.get("minItems"):
        schema["type"] = types_ = ["null", *[t for t in types_ if t]]
    enum = (schema.get("items") or {}).get("enum")
    if "array" in types_ and enum and "examples" not in schema:
        schema["examples"] = list(enum)
    if None in (schema.get("enum") or []):
        schema.setdefault("values_display", {"null": "none"})
    schema["description_md"] = md
    out = Param(value, description=None, schema=schema)
    out.resolve(value)  # a default the schema refuses is a DAG bug: fail at parse time, not in the form
    return out


def form_params(params: dict[str, Param], defaults: dict[str, Any] | None = None) -> dict[str, Param]:
    """Every Param through ``form_param``, with ``defaults`` (say, the demo's settings) as default values."""
    defaults = defaults or {}
    unknown = sorted(set(defaults) - set(params))
    if unknown:
        raise KeyError(f"defaults for unknown Params {unknown}; the DAG's Params are {sorted(params)}")
    return {name: form_param(p, defaults.get(name, ...)) for name, p in params.items()}
