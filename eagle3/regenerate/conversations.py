"""The conversations of a dataset as regenerate sees them: OpenAI ``messages`` with an id.

Files and records are read by ``eagle3.datasets`` (the reader tokenize uses too), so a
record regenerate accepts is one tokenize accepts, and the reverse. Regenerate's own rules:
a conversation needs a user turn (something to answer; an assistant turn is not needed,
prompt-only datasets are answered), tool-call arguments go back to the JSON strings of the
OpenAI wire format, and each conversation gets a stable id: the record's own ``id`` when it
has one (unique in the file: a repeated one is an InputError), else ``L<line>-<content hash>``;
the line keeps duplicates apart. Resume matches a conversation by its ``key``, the id plus a
hash of what is replayed, so an edited record is a new conversation even when it keeps its id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from eagle3 import storage
from eagle3.datasets import readers, records
from eagle3.errors import InputError

NO_USER = "no user message"  # regenerate's own rule: a conversation needs something to answer


@dataclass(kw_only=True)
class Conversation(records.Conversation):
    """One input conversation, normalised (``eagle3.datasets.records``), with regenerate's id."""

    id: str
    original: dict[str, Any] = field(default_factory=dict)  # the record as read, for provenance

    @property
    def key(self) -> str:
        """What resume matches a finished conversation by (``resume_key``)."""
        return resume_key(self.id, self.messages, self.tools)


class BadRecord(ValueError):
    """A record that cannot be replayed; the stage writes it to errors.jsonl. ``reason`` is the short
    fixed reason (``eagle3.datasets.records``' for a refused record)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def conversation_id(line: int, record: Any) -> str:
    if isinstance(record, dict) and isinstance(record.get("id"), (str, int)) and str(record["id"]):
        return str(record["id"])
    digest = hashlib.sha256(json.dumps(record, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"L{line}-{digest[:12]}"


def resume_key(conv_id: str, messages: list[dict[str, Any]], tools: list[dict] | None) -> str:
    """``<id>-<hash of the messages and tools as replayed>``: a record that kept its own id but changed is
    a new conversation. The output's ``original_messages`` and ``tools`` give the same key back."""
    content = json.dumps({"messages": messages, "tools": tools or None}, sort_keys=True, ensure_ascii=False)
    return f"{conv_id}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """The message as the OpenAI API takes it: tool-call arguments as a JSON string."""
    if "tool_calls" not in message:
        return message
    calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"],
                                                                          ensure_ascii=False)}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _check_format(fmt: str) -> None:
    if fmt == "tokenized":
        raise InputError(f"format {fmt!r} cannot be regenerated (it holds token ids, not text); "
                         "set regenerate: false for it or use messages/sharegpt")


def to_conversation(line: int, record: Any, fmt: str) -> Conversation:
    """Normalise one record; raises BadRecord (with the reason) when it cannot be replayed."""
    _check_format(fmt)
    try:
        if isinstance(record, records.Reject):
            raise record
        conv = records.parse_messages(record, fmt, line)
    except records.Reject as r:
        raise BadRecord(r.reason, r.detail) from None
    if not any(m["role"] == "user" for m in conv.messages):
        raise BadRecord(NO_USER, "the conversation has no user turn, so there is nothing to answer")
    return Conversation(id=conversation_id(line, record), line=line, messages=[_wire(m) for m in conv.messages],
                        tools=conv.tools, original=record)


def read_conversations(source: str, fmt: str, max_samples: int | None = None
                       ) -> Iterator[tuple[int, Conversation | BadRecord]]:
    """(line, Conversation) for good records and (line, BadRecord) for bad ones, in file order; the first
    ``max_samples`` records (good or bad). A missing, empty or unreadable file, or two conversations with
    the same id, is an InputError (raised when the reader gets there, before it yields the second)."""
    _check_format(fmt)
    n = 0
    first_line: dict[str, int] = {}  # id -> the line it is on
    for line, record in readers.read_objects(storage.local_path(source), fmt, display=source):
        if max_samples is not None and n >= max_samples:
            return
        n += 1
        try:
            conv = to_conversation(line, record, fmt)
        except BadRecord as e:
            yield line, e
            continue
        if conv.id in first_line:
            # Resume and the output name a conversation by its id: two would share (or lose) one answer.
            raise InputError(f"{source}: lines {first_line[conv.id]} and {line} both have id {conv.id!r}; "
                             "a conversation's id must be unique in its dataset. Give one of them another id, "
                             "or remove the id field from both (a record without one is named by its line)")
        first_line[conv.id] = line
        yield line, conv
