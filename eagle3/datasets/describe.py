"""``describe``: an untrusted input value, shown safely in a reject's detail or an error message.

The repr of a parsed value can be huge (a YAML alias bomb expands exponentially) or
recurse past the interpreter's limit (JSON nested 900 deep), and repr of an int over
4,300 digits raises. So strings are shown truncated, small scalars as they are, and
anything else by its type alone. Imports nothing, so the manifest stays light.
"""

from __future__ import annotations

from typing import Any


def describe(value: Any, width: int = 60) -> str:
    """``'messagez'``, ``1.5``, ``None``, or ``a list`` / ``a dict`` / ``a bytes``."""
    if isinstance(value, str):
        return repr(value[:width]) + ("..." if len(value) > width else "")
    if value is None or isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) < 10**18):
        return repr(value)
    return f"a {type(value).__name__}"
