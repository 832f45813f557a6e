"""Typed stage configs: the one schema of every stage's settings (torch-free).

Each stage has a frozen dataclass with a docstring under every field. The same
class is the schema of the CLI (its flags, types, defaults and help are derived
here, so argparse is no second schema), of the JSON a subprocess stage receives
(``eagle3 <stage> --config cfg.json``) and of the DAG's Params (defaults and
descriptions are read from the fields). Unknown keys are refused.

``RENAMED`` is the one table of renamed keys: an old name is still read, with a deprecation message, for
one release, wherever its new name is valid (Config JSON and keyword arguments, the command line, store.json,
a draft checkpoint's config.json).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import logging
import textwrap
import types
import typing
import warnings
from typing import Any, Iterable, TypeVar

from eagle3.errors import InputError

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_SEED = 42
"""The seed every seeded stage (regenerate, merge, train) starts from unless told otherwise."""
DEFAULT_MAX_SEQ_LEN = 8192
"""Tokens a sample is cut to (merge) and the cap the stats count against, unless a run sets max_seq_len."""


RENAMED = {
    "storage": "storage_option",  # the quantisation option (``eagle3.storage`` is the file/S3 layer)
    "layers": "aux_layers",
    "aux_layer_ids": "aux_layers",
}
"""Old key -> its one name (issue 23). Read for one more release, with a deprecation message, then refused."""


def renamed_keys(data: dict[str, Any], names: Iterable[str], where: str, spell=lambda k: k,
                 fix: str = "") -> dict[str, Any]:
    """``data`` with each old key (``RENAMED``) whose new name is in ``names`` renamed to it, saying so once per
    key (a log warning and a DeprecationWarning naming ``where``, both names as ``spell`` writes them, e.g. as
    flags, and ``fix``). Giving both names is an InputError."""
    names = set(names)
    old = [k for k in data if k not in names and RENAMED.get(k) in names]
    if not old:
        return data
    out = {k: v for k, v in data.items() if k not in old}
    for k in old:
        new = RENAMED[k]
        if new in out:
            raise InputError(f"{where}: {spell(k)} and {spell(new)} name the same setting; keep {spell(new)} only")
        deprecated(f"{where}: {spell(k)} is deprecated, use {spell(new)}{f' ({fix})' if fix else ''}; the old "
                   "name is read for one more release")
        out[new] = data[k]
    return out


def deprecated(message: str) -> None:
    """Say that an old name was used: in the log (what a CLI or Airflow user reads) and as a DeprecationWarning
    (what ``python -W error`` and the tests catch)."""
    log.warning(message)
    warnings.warn(message, DeprecationWarning, stacklevel=3)


def renamed_fields(cls: type[T]) -> type[T]:
    """Class decorator for a Config dataclass: its keyword arguments also take the old names (``RENAMED``)
    of its fields, for one release."""
    init, names = cls.__init__, {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **renamed_keys(kwargs, names, cls.__name__))

    cls.__init__ = __init__
    return cls


def old_names(name: str) -> list[str]:
    """The old names of field ``name`` (``RENAMED``)."""
    return [old for old, new in RENAMED.items() if new == name]


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys are an InputError
    naming the dotted key and listing the valid ones (old names, ``RENAMED``, are read with a warning)."""
    if not isinstance(data, dict):
        raise InputError(f"{where or cls.__name__}: expected a JSON object of {cls.__name__} fields, "
                         f"got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    data = renamed_keys(data, names, where or cls.__name__)
    prefix = f"{where}." if where else ""
    unknown = sorted(set(data) - names)
    if unknown:
        raise InputError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} for {cls.__name__}; "
            f"valid keys: {', '.join(sorted(names))}"
        )
    missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in data and _required(f))
    if missing:
        raise InputError(f"{cls.__name__} needs {', '.join(prefix + k for k in missing)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(v, hints[k], prefix + k) for k, v in data.items()})


def to_dict(cfg: Any) -> dict[str, Any]:
    """JSON-able dict of a config (tuples become lists); ``from_dict`` inverts it."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def default(cls: type, name: str) -> Any:
    """The default value of field ``name`` of ``cls`` (what the DAG's Params start from)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise KeyError(f"{cls.__name__}.{name} has no default")
    raise KeyError(f"{cls.__name__} has no field {name!r}")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: the docstring written under it} for a dataclass (and its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, after in zip(body, body[1:] + [None]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


# ------------------------------------------------------------------ types
def _parts(tp) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), len(args) < len(typing.get_args(tp))
    return tp, False


def _coerce(value: Any, tp, where: str) -> Any:
    """Check (and gently convert: list -> tuple, int -> float) a JSON value for a field of type ``tp``."""
    base, nullable = _parts(tp)
    if value is None:
        if nullable or tp is Any:
            return None
        raise InputError(f"{where} must not be null")
    origin = typing.get_origin(base)
    if base is Any or base is object:
        return value
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif base is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            args = typing.get_args(base)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
            if len(args) == len(value):
                return tuple(_coerce(v, a, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    elif origin in (dict, list) or base in (dict, list):
        if isinstance(value, origin or base):
            return value
    elif typing.get_origin(base) in (typing.Union, types.UnionType):
        return value
    else:
        return value
    raise InputError(f"{where}={value!r} is not a {_type_name(tp)}")


def _type_name(tp) -> str:
    base, nullable = _parts(tp)
    name = getattr(base, "__name__", str(base)).replace("typing.", "")
    if typing.get_origin(base) is tuple:
        name = "list"
    return f"{name} or null" if nullable else name


def _parse_text(text: str, tp, flag: str) -> Any:
    """A command-line string -> a value of the field's type (lists are comma-separated)."""
    base, nullable = _parts(tp)
    if nullable and text.lower() in ("", "none", "null"):
        return None
    origin = typing.get_origin(base)
    try:
        if base is int:
            return int(text)
        if base is float:
            return float(text)
        if origin is tuple:
            args = typing.get_args(base)
            item = args[0]
            values = [v.strip() for v in text.split(",") if v.strip()]
            return tuple(_parse_text(v, item if args[-1] is Ellipsis else args[i], flag)
                         for i, v in enumerate(values))
        if origin is dict or base is dict:
            return json.loads(text)
    except (ValueError, IndexError, json.JSONDecodeError):
        raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected {_type_name(tp)}") from None
    return text


# ------------------------------------------------------------------ CLI
def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, *, aliases: dict[str, list[str]] | None = None,
                         skip: tuple[str, ...] = (), choices: dict[str, tuple] | None = None) -> None:
    """One flag per field of ``cls``: ``--field-name`` (plus ``aliases[field]``), typed, with the field's
    docstring and default as help. Flags not given stay out of the namespace, so ``config_from_args``
    lets the dataclass supply its defaults (one owner) and ``--config FILE`` fill the rest. A field's old
    names (``RENAMED``) are hidden flags of their own that ``config_from_args`` reads with a warning."""
    aliases, choices = aliases or {}, choices or {}
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    group = parser.add_argument_group(f"{cls.__name__} fields (or all of them as JSON with --config)")
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        names = [flag_name(f.name), *aliases.get(f.name, [])]
        tp = hints[f.name]
        base, _ = _parts(tp)
        help_text = docs.get(f.name, "")
        if _required(f):
            help_text += " (required)"
        else:
            help_text += f" (default: {default(cls, f.name)!r})"
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": help_text.replace("%", "%%")}
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=functools.partial(_parse_text, tp=tp, flag=names[0]), choices=choices.get(f.name),
                          metavar="N" if base is int else "X" if base is float
                          else "A,B" if typing.get_origin(base) is tuple else None)
        group.add_argument(*names, dest=f.name, **kwargs)
        for old in old_names(f.name):
            group.add_argument(flag_name(old), **{**kwargs, "dest": old, "help": argparse.SUPPRESS})


def config_from_args(cls: type[T], args: argparse.Namespace, base: dict[str, Any] | None = None) -> T:
    """The config: ``--config`` JSON (if any), then ``base``, then the flags given on the command line."""
    data: dict[str, Any] = {}
    path = getattr(args, "config", None)
    if path:
        from eagle3 import storage

        try:
            raw = storage.read_bytes(path)
        except OSError as e:
            raise InputError(f"--config: not a readable file ({e.strerror or e})", file=path) from None
        try:
            data = json.loads(raw)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise InputError(f"--config: not valid JSON ({e})", file=path) from None
        if not isinstance(data, dict):
            raise InputError(f"--config holds a JSON {type(data).__name__}; it must be one object whose keys "
                             f"are {cls.__name__} fields (the flags' names with _, see --help)", file=path)
    names = {f.name for f in dataclasses.fields(cls)}
    data = renamed_keys(data, names, f"--config {path}")
    data.update(base or {})
    flags = {k: v for k, v in vars(args).items() if k in names or RENAMED.get(k) in names}
    data.update(renamed_keys(flags, names, "command line", spell=flag_name))
    return from_dict(cls, data, cls.__name__)
