"""Read dataset files into conversations or token records; refuse bad lines with a reason.

Formats (see docs/CONTRACTS.md): ``messages`` (OpenAI style), ``sharegpt``
(``conversations`` with ``from``/``value`` or ``role``/``content``) and
``tokenized`` (``input_ids`` + ``loss_mask``), each from .jsonl, .jsonl.gz or
.parquet. ``read_records`` yields one item per input record, in file order:
a ``Conversation``, a ``TokenRecord`` or a ``Rejected`` naming the 1-based line
(the row number for Parquet) and a short reason. Blank JSONL lines hold no
record and are skipped. A missing, empty or unreadable file is an InputError.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from eagle3.errors import InputError

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

# Input role names -> the roles chat templates know.
MESSAGE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                 "tool": "tool", "function": "tool"}
SHAREGPT_ROLES = {**MESSAGE_ROLES, "human": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "observation": "tool", "function_response": "tool", "function_call": "function_call"}
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


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


class _Reject(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


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
                raise _Reject(BAD_CONTENT, f"{where}: only text parts are supported, got {str(part)[:80]}")
        return "".join(parts)
    raise _Reject(BAD_CONTENT, f"{where}: expected a string, got {type(content).__name__}")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI tool calls with ``function.arguments`` parsed into a dict."""
    if not isinstance(calls, list) or not calls:
        raise _Reject(BAD_TOOLS, f"{where}.tool_calls must be a non-empty list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _Reject(BAD_TOOLS, f"{where}.tool_calls[{j}] needs function.name")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise _Reject(BAD_TOOLS, f"{where}.tool_calls[{j}].function.arguments is not valid JSON") from None
        if not isinstance(args, dict):
            raise _Reject(BAD_TOOLS, f"{where}.tool_calls[{j}].function.arguments must be a JSON object")
        entry = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call, dict) and call.get("id"):
            entry["id"] = str(call["id"])
        out.append(entry)
    return out


def _message(raw: Any, i: int, roles: dict[str, str]) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise _Reject(NOT_OBJECT, f"{where} is not an object")
    role = raw.get("role", raw.get("from"))
    if role not in roles:
        raise _Reject(UNKNOWN_ROLE, f"{where}: role {role!r}; valid roles: {', '.join(sorted(roles))}")
    role = roles[role]
    content = _text(raw.get("content", raw.get("value")), where)
    msg: dict[str, Any] = {"role": role, "content": content}
    if role == "function_call":  # ShareGPT: the value is the call's JSON
        try:
            call = json.loads(content)
        except ValueError:
            raise _Reject(BAD_TOOLS, f"{where}: function_call value is not JSON") from None
        return {"role": "assistant", "content": "", "tool_calls": _tool_calls([call], where)}
    if role == "assistant":
        if raw.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(raw["tool_calls"], where)
        reasoning = next((raw[k] for k in _REASONING_KEYS if isinstance(raw.get(k), str) and raw[k].strip()), None)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(raw.get(key), str):
                msg[key] = raw[key]
    if not content.strip() and not msg.get("tool_calls"):
        raise _Reject(EMPTY_CONTENT, f"{where} ({role}) has empty content")
    return msg


def parse_conversation(obj: Any, fmt: str, line: int) -> Conversation:
    """Validate one ``messages``/``sharegpt`` record (raises _Reject)."""
    if not isinstance(obj, dict):
        raise _Reject(NOT_OBJECT, f"got {type(obj).__name__}")
    key = "messages" if fmt == "messages" else ("conversations" if "conversations" in obj else "messages")
    raw = obj.get(key)
    if isinstance(raw, str):  # Parquet files often hold the list as a JSON string
        try:
            raw = json.loads(raw)
        except ValueError:
            raise _Reject(MALFORMED_JSON, f"{key} holds a string that is not JSON") from None
    if not isinstance(raw, list) or not raw:
        raise _Reject(NO_MESSAGES, f"key {key!r} missing or empty")
    roles = MESSAGE_ROLES if fmt == "messages" else SHAREGPT_ROLES
    messages = [_message(_drop_none(m), i, roles) for i, m in enumerate(raw)]
    if not any(m["role"] == "assistant" for m in messages):
        raise _Reject(NO_ASSISTANT, "nothing to learn: no assistant turn")
    tools = obj.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise _Reject(BAD_TOOLS, "tools holds a string that is not JSON") from None
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise _Reject(BAD_TOOLS, "tools must be a list of JSON-schema objects")
    return Conversation(line=line, messages=messages, tools=tools or None)


def _drop_none(m: Any) -> Any:
    # Parquet structs fill absent fields with None; templates treat a present None differently.
    return {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m


def parse_tokens(obj: Any, line: int, vocab_size: int | None) -> TokenRecord:
    """Validate one ``tokenized`` record (raises _Reject)."""
    if not isinstance(obj, dict):
        raise _Reject(NOT_OBJECT, f"got {type(obj).__name__}")
    arrays = []
    # Integers only (numpy would silently truncate 1.5); a mask may also be booleans (Parquet list<bool>).
    for key, allowed in (("input_ids", (int,)), ("loss_mask", (int, bool))):
        values = obj.get(key)
        values = [] if values is None else values
        if not isinstance(values, list) or not all(type(v) in allowed for v in values):
            raise _Reject(BAD_TOKENS, f"{key} must be a flat list of integers")
        try:
            arrays.append(np.asarray(values, dtype=np.int64))
        except OverflowError:
            arrays.append(np.asarray(values, dtype=object))  # > int64: reported as out of range below
    return check_tokens(arrays[0], arrays[1], line, vocab_size)


def check_tokens(ids: np.ndarray, mask: np.ndarray, line: int, vocab_size: int | None) -> TokenRecord:
    """The checks of a ``tokenized`` record on its two integer arrays (raises _Reject)."""
    if len(ids) == 0:
        raise _Reject(NO_TOKENS, "input_ids missing or empty")
    if len(ids) != len(mask):
        raise _Reject(LENGTH_MISMATCH, f"{len(ids)} input_ids but {len(mask)} loss_mask values")
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        k = int(np.argmax(bad))
        raise _Reject(MASK_NOT_BINARY, f"loss_mask[{k}] = {int(mask[k])}")
    bad = (ids < 0) | (ids >= (vocab_size or 2**31))  # stored as int32
    if bad.any():
        k = int(np.argmax(bad))
        raise _Reject(ID_OUT_OF_RANGE, f"input_ids[{k}] = {int(ids[k])}, vocab size {vocab_size}")
    if not mask.any():
        raise _Reject(NO_LOSS_TOKENS, "loss_mask is all 0: nothing to learn")
    return TokenRecord(line=line, input_ids=ids.astype(np.int32), loss_mask=mask.astype(np.uint8))


class _FastTokens:
    """simdjson for well-formed ``tokenized`` lines: it parses and copies the two integer
    arrays into numpy in C++ (6.3x faster than json.loads into Python lists plus np.asarray
    on 10K seed-format lines of ~1,000 tokens). Anything unusual returns None and the line
    takes the checked json.loads path, which words the reject reason."""

    def __init__(self):
        try:
            import simdjson
        except ImportError:  # optional speed-up; the json path gives the same records
            self.parser = None
        else:
            self.parser = simdjson.Parser()

    def __call__(self, raw: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        # as_buffer flattens nested arrays, so take only lines whose two lists are the only brackets;
        # simdjson keeps the first of duplicate keys and json the last, so take only lines with one of each.
        if (self.parser is None or raw.count(b"[") != 2 or raw.count(b'"input_ids"') != 1
                or raw.count(b'"loss_mask"') != 1):
            return None
        try:
            doc = self.parser.parse(raw)
            try:
                ids = np.frombuffer(doc["input_ids"].as_buffer(of_type="i"), np.int64)
                mask = np.frombuffer(doc["loss_mask"].as_buffer(of_type="i"), np.int64)
            finally:
                del doc  # the parser may only be reused once no document refers to it
        except Exception:  # bad JSON, UTF-8, types, keys: the slow path says which
            return None
        return ids, mask


def _jsonl_lines(path: str, display: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) of each non-blank line."""
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for line, raw in enumerate(f, 1):
                if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte-order mark (Windows editors) is not part of the record
                if raw.strip():
                    yield line, raw
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"cannot read: {e} (is it really {'gzip' if opener is gzip.open else 'text'}?)",
                         file=display) from None


def _json_object(raw: bytes) -> Any:
    """The parsed line, or a _Reject saying why it is not JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return _Reject(INVALID_UTF8, f"byte {e.start}: {e.reason}")
    try:
        return json.loads(text)
    except ValueError as e:
        return _Reject(MALFORMED_JSON, str(e)[:200])


def _jsonl_objects(path: str, display: str) -> Iterator[tuple[int, Any]]:
    """(line, parsed object or _Reject) for each non-blank line."""
    for line, raw in _jsonl_lines(path, display):
        yield line, _json_object(raw)


def _jsonl_tokens(path: str, display: str, vocab_size: int | None) -> Iterator[tuple[int, Any]]:
    """Like _jsonl_objects for ``tokenized`` lines, but well-formed ones come back as a
    ready TokenRecord (or _Reject) through the simdjson path."""
    fast = _FastTokens()
    for line, raw in _jsonl_lines(path, display):
        arrays = fast(raw)
        if arrays is None:
            yield line, _json_object(raw)
            continue
        try:
            yield line, check_tokens(arrays[0], arrays[1], line, vocab_size)
        except _Reject as r:
            yield line, r


def _parquet_objects(path: str, display: str) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"not a readable Parquet file: {e}", file=display) from None
    line = 0
    for batch in pf.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            line += 1
            yield line, row


def read_records(path: str, fmt: str, display: str | None = None,
                 vocab_size: int | None = None) -> Iterator[Conversation | TokenRecord | Rejected]:
    """Yield one item per record of the local file ``path`` (``display`` names it in errors).

    Raises InputError for a missing or empty file, or one that holds no record.
    """
    display = display or path
    if not os.path.isfile(path):
        raise InputError("file does not exist; check the manifest's source", file=display)
    if os.path.getsize(path) == 0:
        raise InputError("file is empty; remove the dataset from the manifest or fill it", file=display)
    if path.lower().endswith(".parquet"):
        objects = _parquet_objects(path, display)
    elif fmt == "tokenized":
        objects = _jsonl_tokens(path, display, vocab_size)
    else:
        objects = _jsonl_objects(path, display)
    seen = 0
    for line, obj in objects:
        seen += 1
        try:
            if isinstance(obj, _Reject):
                raise obj
            if isinstance(obj, TokenRecord):
                yield obj
            elif fmt == "tokenized":
                yield parse_tokens(obj, line, vocab_size)
            else:
                yield parse_conversation(obj, fmt, line)
        except _Reject as r:
            yield Rejected(line, r.reason, r.detail)
    if seen == 0:
        raise InputError("file holds no records (only blank lines or no rows)", file=display)
