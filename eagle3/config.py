"""Typed stage configs: frozen dataclasses built from dicts that refuse unknown keys."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from eagle3.errors import InputError

T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys are an InputError
    naming the dotted key and listing the valid ones."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        raise InputError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} for {cls.__name__}; "
            f"valid keys: {', '.join(sorted(names))}"
        )
    return cls(**data)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
