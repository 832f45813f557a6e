"""A failed task's error, kept in the run folder: what the report, the UI page and the demo print.

The operator writes ``errors/<task_id>[.<map_index>].json`` (eagle3.layout.RunLayout.task_error) when a
task fails, and removes it when a retry succeeds. One record::

    {"task_id", "map_index", "name": the mapped instance's name (tokenize[alpha]) or None, "try_number",
     "error": class name, "lines": [the first lines that say why], "message": the whole message (capped)}

``lines`` is what a person needs first: for a stage run as ``eagle3 <stage>`` in a child process, the
CLI's ``eagle3 <stage>: error: ...`` line and what follows it; else the last line of a traceback; else the
message's first lines.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from eagle3 import storage
from eagle3.layout import ERRORS, RunLayout, join

log = logging.getLogger(__name__)

MAX_MESSAGE = 4000
_CLI_ERROR = re.compile(r"^eagle3 [\w-]+: error: ")
_LOG_PREFIX = re.compile(r"^\S+ \S+ (INFO|WARNING|ERROR|DEBUG) \S+: ")  # eagle3.cli's logging format


def first_lines(message: str, n: int = 3) -> list[str]:
    """The lines of an error message that say why, at most ``n``."""
    lines = [ln.rstrip() for ln in str(message).splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if _CLI_ERROR.match(line):
            return [_CLI_ERROR.sub("", line)] + lines[i + 1:i + n]
    if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        last = [ln for ln in lines if not ln.startswith(" ") and not _LOG_PREFIX.match(ln)]
        return last[-1:] if last else lines[-1:]
    return lines[:n]


def label(task_id: str, map_index: int | None = None, name: str | None = None) -> str:
    """``evaluate``, ``tokenize[alpha]`` (a mapped task's name) or ``extract[1]``."""
    if map_index is None or map_index < 0:
        return task_id
    return f"{task_id}[{name if name not in (None, '') else map_index}]"


def record(task_id: str, map_index: int | None, try_number: int | None, exc: BaseException,
           name: str | None = None) -> dict[str, Any]:
    message = str(exc) or type(exc).__name__
    return {"task_id": task_id, "map_index": -1 if map_index is None else map_index, "name": name,
            "try_number": try_number, "error": type(exc).__name__, "lines": first_lines(message),
            "message": message[:MAX_MESSAGE]}


def write(layout: RunLayout, task_id: str, map_index: int | None, try_number: int | None,
          exc: BaseException, name: str | None = None) -> str:
    uri = layout.task_error(task_id, map_index)
    storage.write_json(uri, record(task_id, map_index, try_number, exc, name))
    return uri


def clear(layout: RunLayout, task_id: str, map_index: int | None) -> None:
    """Remove an earlier try's error once the task succeeded."""
    storage.delete(layout.task_error(task_id, map_index))  # no error when there is none


def read(layout: RunLayout) -> dict[tuple[str, int], dict]:
    """{(task_id, map_index): record} of the run's failed tasks (unreadable files are skipped, logged)."""
    folder = join(layout.dir, ERRORS)
    out: dict[tuple[str, int], dict] = {}
    try:
        names = storage.list_files(folder)
    except Exception as e:  # noqa: BLE001 (an S3 error must not take a report down: the section is left out)
        log.warning("could not list %s: %s", folder, e)
        return out
    for name in names:
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            rec = storage.read_json(join(folder, name))
        except (OSError, ValueError) as e:
            log.warning("could not read %s: %s", join(folder, name), e)
            continue
        if isinstance(rec, dict) and isinstance(rec.get("task_id"), str):
            out[(rec["task_id"], int(rec.get("map_index", -1)))] = rec
    return out
