"""One parsed input record -> a ``Conversation`` or ``TokenRecord``, or a ``Reject`` with a reason.

The one owner of what a dataset record may hold: the formats' keys, the role names and
their aliases, the reasoning keys, tools and tool calls, content parts. Every stage that
reads a dataset (tokenize, regenerate) parses its records here, so a record is accepted
or refused the same way everywhere; a stage adds only its own rule on top (tokenize: an
assistant turn to learn from; regenerate: a user turn to answer).

``readers`` turns files into records and calls these. Every value is type-checked
before it is used, and every parse or decode failure of a record is a Reject: no
record can raise anything else. What the chat template and the Rust tokenizer
cannot take is refused here, before either runs: a string holding a lone UTF-16
surrogate (``"\\ud800"`` in JSON parses to one, and the tokenizer raises a
TypeError on it), nesting deeper than MAX_DEPTH, and Parquet values that are not
JSON (bytes, dates, decimals). Reasons are short fixed strings so rejects can be
counted; the detail says where and what.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from eagle3.datasets.describe import describe

# Reasons are short and fixed so rejects can be counted; ``detail`` says the rest.
MALFORMED_JSON = "malformed JSON"
INVALID_UTF8 = "invalid UTF-8"
NOT_OBJECT = "not a JSON object"
NO_MESSAGES = "no messages"
UNKNOWN_ROLE = "unknown role"
EMPTY_CONTENT = "empty content"
BAD_CONTENT = "content is not text"
NO_ASSISTANT = "no assistant message"
BAD_TOOLS = "bad tools or tool_calls"
LENGTH_MISMATCH = "ids/mask length mismatch"
MASK_NOT_BINARY = "mask not 0/1"
ID_OUT_OF_RANGE = "id out of range"
NO_TOKENS = "no tokens"
NO_LOSS_TOKENS = "no loss tokens"
BAD_TOKENS = "input_ids/loss_mask not integer lists"
TOO_DEEP = "nested too deeply"
LONE_SURROGATE = "lone UTF-16 surrogate"
NOT_JSON_VALUE = "value is not JSON"

MAX_DEPTH = 100
"""Deepest list/object nesting accepted in a conversation record, counted from its
``messages`` list (tool-call arguments sit at depth 6). Real data nests a few levels,
JSON-schema tools perhaps 20; json.loads raises RecursionError near 1,000, and the
template and json.dumps recurse again on what it returns, so deeper input is refused."""

# Input role names -> the roles chat templates know. ShareGPT speakers are matched in any case ("Human").
MESSAGE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                 "tool": "tool", "function": "tool"}
SHAREGPT_ROLES = {**MESSAGE_ROLES, "human": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant", "observation": "tool", "function_response": "tool",
                  "function_call": "function_call"}
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
"""Keys of an assistant message that may hold its reasoning, first match wins; all become ``reasoning_content``."""


@dataclass
class Conversation:
    line: int
    messages: list[dict[str, Any]]
    """Normalised: role in system/user/assistant/tool, content a str; assistant
    messages may carry ``tool_calls`` (OpenAI shape, arguments a dict) and
    ``reasoning_content``."""
    tools: list[dict[str, Any]] | None = None


@dataclass
class TokenRecord:
    line: int
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8


@dataclass
class Rejected:
    line: int
    reason: str
    detail: str = ""


class Reject(Exception):
    """Raised by the parse functions: this record is refused for ``reason``."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _loads(text: str, reason: str, what: str) -> Any:
    """json.loads; bad JSON is a Reject with ``reason``, nesting too deep for the parser is TOO_DEEP."""
    try:
        return json.loads(text)
    except RecursionError:
        raise Reject(TOO_DEEP, f"{what} nests deeper than the JSON parser allows") from None
    except ValueError as e:  # JSONDecodeError, and ints over Python's 4,300-digit limit
        raise Reject(reason, f"{what} is not valid JSON: {str(e)[:200]}") from None


def _check_text(text: str, where: str) -> None:
    """A lone surrogate is refused: json.loads pairs valid escapes, so one left over is unpaired,
    and UTF-8 cannot encode it (a C-speed test; a regex search was 7x slower on non-ASCII text)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise Reject(LONE_SURROGATE, f"{where} holds an unpaired surrogate ({text[e.start]!r}) at char "
                                         f"{e.start}: not Unicode text, so it cannot be tokenized") from None


_SCALARS = (type(None), bool, int, float)


def _check_values(root: Any, where: str) -> None:
    """Refuse in arbitrary JSON (tool arguments, tools) what the template and tokenizer cannot
    take: a value that is not JSON, a lone surrogate in a string or key, nesting deeper than
    MAX_DEPTH. A lean walk, level by level, decides (json.dumps costs 6 us a call even on small
    arguments, more than the walk); a second walk names the place of a fault."""
    level, depth = [root], 0
    while level:
        depth += 1
        below: list = []
        for value in level:
            kind = type(value)
            if kind is str:
                if not value.isascii() and not _encodes(value):
                    _find_fault(root, where)
            elif kind is dict:
                try:
                    keys = "".join(value)  # one C call checks that every key is a string
                except TypeError:
                    _find_fault(root, where)
                if depth > MAX_DEPTH or not (keys.isascii() or _encodes(keys)):
                    _find_fault(root, where)
                below.extend(value.values())
            elif kind is list:
                if depth > MAX_DEPTH:
                    _find_fault(root, where)
                below.extend(value)
            elif kind not in _SCALARS:
                _find_fault(root, where)
        level = below


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _find_fault(root: Any, where: str) -> None:
    """Raise a Reject naming the first fault's path in ``root``, by the same rules as
    _check_values, depth first and iterative: depth cannot recurse."""
    stack = [(root, 1, (where,))]
    while stack:
        value, depth, path = stack.pop()
        kind = type(value)
        if kind is str:
            _check_text(value, "".join(path))
        elif kind is dict or kind is list:
            if depth > MAX_DEPTH:
                raise Reject(TOO_DEEP, f"{''.join(path)} nests more than {MAX_DEPTH} levels")
            if kind is list:
                stack.extend((v, depth + 1, (*path, f"[{i}]")) for i, v in enumerate(value))
                continue
            for k, v in value.items():
                if not isinstance(k, str):
                    raise Reject(NOT_JSON_VALUE, f"{''.join(path)} has a key of type {type(k).__name__}")
                stack.append((k, depth, (*path, ".<key>")))
                stack.append((v, depth + 1, (*path, f".{k[:40]}")))
        elif kind not in _SCALARS:
            raise Reject(NOT_JSON_VALUE, f"{''.join(path)} is a {kind.__name__}, not a JSON value")
    raise AssertionError(f"{where}: _check_values saw a fault that _find_fault did not")  # the two walks disagree


def _text(content: Any, where: str) -> str:
    """Message content as one string; OpenAI content parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise Reject(BAD_CONTENT, f"{where}: only text parts are supported, got {describe(part)}")
        return "".join(parts)
    raise Reject(BAD_CONTENT, f"{where}: expected a string, got {type(content).__name__}")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI tool calls with ``function.arguments`` parsed into a dict."""
    if not isinstance(calls, list) or not calls:
        raise Reject(BAD_TOOLS, f"{where}.tool_calls must be a non-empty list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise Reject(BAD_TOOLS, f"{where}.tool_calls[{j}] needs function.name")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            args = _loads(args, BAD_TOOLS, f"{where}.tool_calls[{j}].function.arguments") if args.strip() else {}
        if not isinstance(args, dict):
            raise Reject(BAD_TOOLS, f"{where}.tool_calls[{j}].function.arguments must be a JSON object")
        _check_text(fn["name"], f"{where}.tool_calls[{j}].function.name")
        _check_values(args, f"{where}.tool_calls[{j}].function.arguments")
        entry = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        call_id = call.get("id") if isinstance(call, dict) else None
        if call_id:
            if isinstance(call_id, bool) or not isinstance(call_id, (str, int)):
                raise Reject(BAD_TOOLS, f"{where}.tool_calls[{j}].id must be a string, got {describe(call_id)}")
            entry["id"] = str(call_id)
            _check_text(entry["id"], f"{where}.tool_calls[{j}].id")
        out.append(entry)
    return out


def _role(raw: dict, where: str, fmt: str) -> str:
    role = raw.get("role", raw.get("from"))
    roles = MESSAGE_ROLES if fmt == "messages" else SHAREGPT_ROLES
    mapped = roles.get(role if fmt == "messages" else role.lower()) if isinstance(role, str) else None
    if mapped is None:
        raise Reject(UNKNOWN_ROLE, f"{where}.role must be one of {', '.join(sorted(roles))}, got {describe(role)}")
    return mapped


def _message(raw: Any, i: int, fmt: str) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise Reject(NOT_OBJECT, f"{where} is not an object")
    role = _role(raw, where, fmt)
    content = _text(raw.get("content", raw.get("value")), where)
    msg: dict[str, Any] = {"role": role, "content": content}
    if role == "function_call":  # ShareGPT: the value is the call's JSON
        call = _loads(content, BAD_TOOLS, f"{where}: function_call value")
        return {"role": "assistant", "content": "", "tool_calls": _tool_calls([call], where)}
    if role == "assistant":
        if raw.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(raw["tool_calls"], where)
        if raw.get("reasoning_content") is not None and not isinstance(raw["reasoning_content"], str):
            raise Reject(BAD_CONTENT, f"{where}.reasoning_content must be a string, got "
                                      f"{describe(raw['reasoning_content'])}")
        # The other names are taken only when they hold text: other schemas use them for flags or settings.
        reasoning = next((raw[k] for k in REASONING_KEYS if isinstance(raw.get(k), str) and raw[k].strip()), None)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(raw.get(key), str):
                msg[key] = raw[key]
    if not content.strip() and not msg.get("tool_calls"):
        raise Reject(EMPTY_CONTENT, f"{where} ({role}) has empty content")
    for key in ("content", "reasoning_content", "tool_call_id", "name"):  # every string the template renders
        if key in msg:
            _check_text(msg[key], f"{where}.{key}")
    return msg


def parse_conversation(obj: Any, fmt: str, line: int) -> Conversation:
    """Validate one ``messages``/``sharegpt`` record as training data: it needs an assistant turn
    to learn from (raises Reject)."""
    conv = parse_messages(obj, fmt, line)
    if not any(m["role"] == "assistant" for m in conv.messages):
        raise Reject(NO_ASSISTANT, "nothing to learn: no assistant turn")
    return conv


def parse_messages(obj: Any, fmt: str, line: int) -> Conversation:
    """Validate one ``messages``/``sharegpt`` record: the checks every stage shares (raises Reject)."""
    if not isinstance(obj, dict):
        raise Reject(NOT_OBJECT, f"got {type(obj).__name__}")
    key = "messages" if fmt == "messages" else ("conversations" if "conversations" in obj else "messages")
    raw = obj.get(key)
    if isinstance(raw, str):  # Parquet files often hold the list as a JSON string
        raw = _loads(raw, MALFORMED_JSON, f"{key} (a string holding JSON)")
    if not isinstance(raw, list) or not raw:
        hint = ("; it has 'conversations': is the manifest's format sharegpt?" if fmt == "messages"
                and obj.get("conversations") else "")
        raise Reject(NO_MESSAGES, f"key {key!r} missing or empty{hint}")
    messages = [_message(_drop_none(m), i, fmt) for i, m in enumerate(raw)]
    tools = obj.get("tools")
    if isinstance(tools, str):
        tools = _loads(tools, BAD_TOOLS, "tools (a string holding JSON)")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise Reject(BAD_TOOLS, "tools must be a list of JSON-schema objects")
    if tools is not None:
        _check_values(tools, "tools")
    return Conversation(line=line, messages=messages, tools=tools or None)


def _drop_none(m: Any) -> Any:
    # Parquet structs fill absent fields with None; templates treat a present None differently.
    return {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m


def parse_tokens(obj: Any, line: int, vocab_size: int | None) -> TokenRecord:
    """Validate one ``tokenized`` record (raises Reject)."""
    if not isinstance(obj, dict):
        raise Reject(NOT_OBJECT, f"got {type(obj).__name__}")
    arrays = []
    # Integers only (numpy would silently truncate 1.5); a mask may also be booleans (Parquet list<bool>).
    for key, allowed in (("input_ids", (int,)), ("loss_mask", (int, bool))):
        values = obj.get(key)
        values = [] if values is None else values
        if not isinstance(values, list) or not all(type(v) in allowed for v in values):
            raise Reject(BAD_TOKENS, f"{key} must be a flat list of integers")
        try:
            arrays.append(np.asarray(values, dtype=np.int64))
        except OverflowError:
            arrays.append(np.asarray(values, dtype=object))  # > int64: reported as out of range below
    return check_tokens(arrays[0], arrays[1], line, vocab_size)


def check_tokens(ids: np.ndarray, mask: np.ndarray, line: int, vocab_size: int | None) -> TokenRecord:
    """The checks of a ``tokenized`` record on its two integer arrays (raises Reject)."""
    if len(ids) == 0:
        raise Reject(NO_TOKENS, "input_ids missing or empty")
    if len(ids) != len(mask):
        raise Reject(LENGTH_MISMATCH, f"{len(ids)} input_ids but {len(mask)} loss_mask values")
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        k = int(np.argmax(bad))
        raise Reject(MASK_NOT_BINARY, f"loss_mask[{k}] = {int(mask[k])}")
    bad = (ids < 0) | (ids >= (vocab_size or 2**31))  # stored as int32
    if bad.any():
        k = int(np.argmax(bad))
        raise Reject(ID_OUT_OF_RANGE, f"input_ids[{k}] = {int(ids[k])}, vocab size {vocab_size}")
    if not mask.any():
        raise Reject(NO_LOSS_TOKENS, "loss_mask is all 0: nothing to learn")
    return TokenRecord(line=line, input_ids=ids.astype(np.int32), loss_mask=mask.astype(np.uint8))


def parse_json_line(raw: bytes) -> Any:
    """The parsed JSONL line (raises Reject: not UTF-8, not JSON, too deep)."""
    try:
        text = raw.rstrip(b"\r\n").decode("utf-8")  # without the line end, a JSON error's column is the line's
    except UnicodeDecodeError as e:
        raise Reject(INVALID_UTF8, f"byte {e.start}: {e.reason}") from None
    return _loads(text, MALFORMED_JSON, "the line")
