"""Read the conversations of a dataset and put them in one shape: OpenAI ``messages``.

A dataset file holds one conversation per line (JSONL, JSONL.gz) or per row
(Parquet), in the ``messages`` or ``sharegpt`` format of the manifest. Each
conversation gets a stable id: the record's own ``id`` when it has one, else
``L<line>-<content hash>``; the line keeps duplicates apart, and the hash makes
a changed source line a new conversation on resume.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from eagle3 import storage
from eagle3.errors import InputError

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"developer": "system", "function": "tool"}
_SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                   "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
                   "tool": "tool", "function_call": "assistant", "observation": "tool", "function": "tool"}


@dataclass
class Conversation:
    """One input conversation, normalised."""

    id: str
    line: int  # 1-based line (or row) in the source file
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    original: dict[str, Any] = field(default_factory=dict)  # the record as read, for provenance


class BadRecord(ValueError):
    """A record that cannot be replayed; the stage writes it to errors.jsonl."""


def iter_records(source: str) -> Iterator[tuple[int, Any]]:
    """(1-based line, parsed record) for every non-blank line or Parquet row of ``source``."""
    data = storage.read_bytes(source)
    low = source.lower()
    if low.endswith(".parquet"):
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(io.BytesIO(data)).to_pylist(), start=1):
            yield i, row
        return
    if low.endswith(".gz"):
        data = gzip.decompress(data)
    for i, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
        if raw.strip():
            try:
                yield i, json.loads(raw)
            except json.JSONDecodeError as e:
                yield i, BadRecord(f"not valid JSON: {e}")


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        return "".join(parts)
    raise BadRecord(f"{where}: content must be a string, got {type(content).__name__}")


def _maybe_json(value: Any, key: str) -> Any:
    # Parquet files often hold nested lists as JSON strings.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise BadRecord(f"key {key!r} holds a string that is not JSON") from None
    return value


def _from_messages(record: dict) -> tuple[list[dict], list | None]:
    msgs = _maybe_json(record.get("messages"), "messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRecord("key 'messages' must be a non-empty list of {role, content}")
    out = []
    for j, m in enumerate(msgs):
        role = _ROLE_ALIASES.get(m.get("role"), m.get("role")) if isinstance(m, dict) else None
        if role not in ROLES:
            raise BadRecord(f"messages[{j}].role must be one of {', '.join(ROLES)}, got {m!r:.80}")
        msg = {"role": role, "content": _content_text(m.get("content"), f"messages[{j}].content")}
        for key in ("tool_calls", "tool_call_id", "name", "reasoning_content"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    tools = _maybe_json(record.get("tools"), "tools")
    return out, tools if isinstance(tools, list) and tools else None


def _from_sharegpt(record: dict) -> tuple[list[dict], None]:
    turns = _maybe_json(record.get("conversations", record.get("messages")), "conversations")
    if not isinstance(turns, list) or not turns:
        raise BadRecord("key 'conversations' must be a non-empty list of {from, value}")
    out = []
    for j, t in enumerate(turns):
        speaker = t.get("from", t.get("role")) if isinstance(t, dict) else None
        role = _SHAREGPT_ROLES.get(str(speaker).lower())
        if role is None:
            raise BadRecord(f"conversations[{j}].from {speaker!r} is not a known speaker "
                            f"({', '.join(sorted(_SHAREGPT_ROLES))})")
        value = t.get("value", t.get("content"))
        out.append({"role": role, "content": _content_text(value, f"conversations[{j}].value")})
    return out, None


def conversation_id(line: int, record: Any) -> str:
    if isinstance(record, dict) and isinstance(record.get("id"), (str, int)) and str(record["id"]):
        return str(record["id"])
    digest = hashlib.sha256(json.dumps(record, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"L{line}-{digest[:12]}"


def to_conversation(line: int, record: Any, fmt: str) -> Conversation:
    """Normalise one record; raises BadRecord (with the reason) when it cannot be replayed."""
    if isinstance(record, BadRecord):
        raise record
    if not isinstance(record, dict):
        raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
    if fmt == "messages":
        messages, tools = _from_messages(record)
    elif fmt == "sharegpt":
        messages, tools = _from_sharegpt(record)
    else:
        raise InputError(f"format {fmt!r} cannot be regenerated (it holds token ids, not text); "
                         "set regenerate: false for it or use messages/sharegpt")
    if not any(m["role"] == "user" for m in messages):
        raise BadRecord("the conversation has no user turn, so there is nothing to answer")
    return Conversation(id=conversation_id(line, record), line=line, messages=messages, tools=tools,
                        original=record)


def read_conversations(source: str, fmt: str, max_samples: int | None = None
                       ) -> Iterator[tuple[int, Conversation | BadRecord]]:
    """(line, Conversation) for good records and (line, BadRecord) for bad ones, in file order."""
    n = 0
    for line, record in iter_records(source):
        if max_samples is not None and n >= max_samples:
            return
        n += 1
        try:
            yield line, to_conversation(line, record, fmt)
        except BadRecord as e:
            yield line, e
