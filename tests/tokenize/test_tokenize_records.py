"""One record's checks (eagle3/datasets/records.py): wrong JSON types, deep nesting and lone
surrogates are rejects with a reason, never a traceback. Roles of the wrong type (TypeError),
nesting past json.loads' limit (RecursionError) and lone surrogates (the tokenizer's TypeError,
which lost the whole dataset) were crashers before these checks."""

from __future__ import annotations

import json

import pytest

from eagle3.datasets import records
from eagle3.datasets.describe import describe
from eagle3.datasets.records import Reject, parse_conversation, parse_json_line

U = {"role": "user", "content": "q"}
A = {"role": "assistant", "content": "a"}


def call(**function) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "function": {"name": "f", **function}}]}


def reason(line: bytes, fmt: str = "messages") -> str:
    try:
        parse_conversation(parse_json_line(line), fmt, 1)
    except Reject as r:
        return r.reason
    return "accepted"


def rec(*messages, **extra) -> bytes:
    return json.dumps({"messages": list(messages), **extra}).encode()


@pytest.mark.parametrize("line, expected", [
    (rec({"role": ["user"], "content": "q"}, A), records.UNKNOWN_ROLE),  # was TypeError: unhashable type: 'list'
    (rec({"role": {"a": 1}, "content": "q"}, A), records.UNKNOWN_ROLE),  # was TypeError: unhashable type: 'dict'
    (rec({"role": 1, "content": "q"}, A), records.UNKNOWN_ROLE),
    (rec({"content": "q"}, A), records.UNKNOWN_ROLE),
    (rec({"role": "user", "content": {"text": "q"}}, A), records.BAD_CONTENT),
    (rec({"role": "user", "content": [1]}, A), records.BAD_CONTENT),
    (rec({"role": "user", "content": 5}, A), records.BAD_CONTENT),
    (rec(U, {"role": "assistant", "content": "a", "reasoning_content": ["x"]}), records.BAD_CONTENT),
    (rec(U, {"role": "assistant", "content": "", "tool_calls": {"name": "f"}}), records.BAD_TOOLS),
    (rec(U, call(arguments=[1])), records.BAD_TOOLS),
    (rec(U, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": 5}}]}), records.BAD_TOOLS),
    (rec(U, {"role": "assistant", "content": "", "tool_calls": [{"id": ["x"], "function": {"name": "f"}}]}),
     records.BAD_TOOLS),
    (rec(U, A, tools={"name": "f"}), records.BAD_TOOLS),
    (rec(U, A, tools="[1]"), records.BAD_TOOLS),
    (json.dumps({"messages": "not json"}).encode(), records.MALFORMED_JSON),
    (json.dumps({"messages": [U, A], "tools": "{bad"}).encode(), records.BAD_TOOLS),
])
def test_values_of_the_wrong_type_are_rejected(line, expected):
    assert reason(line) == expected


@pytest.mark.parametrize("line", [
    b"[" * 100_000 + b"]" * 100_000,  # the whole line: was RecursionError in json.loads
    b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    rec(U, call(arguments="[" * 100_000 + "]" * 100_000)),  # arguments as a JSON string
    json.dumps({"messages": "[" * 100_000 + "]" * 100_000}).encode(),  # messages as a JSON string (Parquet)
    json.dumps({"messages": [U, A], "tools": "[" * 100_000 + "]" * 100_000}).encode(),
    rec(U, call(arguments=json.loads('{"a":' * 150 + "1" + "}" * 150))),  # parses, but deeper than MAX_DEPTH
    rec(U, A, tools=[json.loads('{"a":' * 150 + "1" + "}" * 150)]),
])
def test_deep_nesting_is_a_reject(line):
    assert reason(line) == records.TOO_DEEP


def test_nesting_within_max_depth_is_accepted():
    args = json.loads('{"a":' * 50 + "1" + "}" * 50)
    assert reason(rec(U, call(arguments=args))) == "accepted"


def test_deep_values_in_a_detail_are_described_not_repr_d():
    # a reject used to quote str(value), unbounded in size; 500 deep stays clear of json.loads' recursion limit
    # under any runner (an xdist worker's stack is deeper: 950 hit it there, and was refused as too deep)
    deep = "[" * 500 + "]" * 500
    line = b'{"messages": [{"role": "user", "content": [' + deep.encode() + b']}, {"role": "assistant"}]}'
    assert reason(line) == records.BAD_CONTENT
    assert describe(json.loads(deep)) == "a list" and describe(7) == "7"
    assert describe(10**5000) == "a int"  # its repr would raise: over the 4,300-digit limit
    assert describe("x" * 100) == repr("x" * 60) + "..."


@pytest.mark.parametrize("line", [
    b'{"messages": [{"role": "user", "content": "caf\\ud800"}, {"role": "assistant", "content": "a"}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]},'
    b' {"role": "assistant", "content": "a"}]}',
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a",'
    b' "reasoning_content": "think \\ud83d"}]}',
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls":'
    b' [{"function": {"name": "f", "arguments": "{\\"city\\": \\"\\\\ud800\\"}"}}]}]}',  # inside the JSON string
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls":'
    b' [{"function": {"name": "f", "arguments": {"\\ud800key": 1}}}]}]}',  # a key
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls":'
    b' [{"function": {"name": "f\\udfff"}}]}]}',
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],'
    b' "tools": [{"type": "function", "function": {"name": "f", "description": "\\ud800"}}]}',
])
def test_lone_surrogates_are_rejected_before_the_tokenizer(line):
    assert reason(line) == records.LONE_SURROGATE


def test_a_surrogate_pair_is_text():
    assert json.loads('"\\ud83d\\ude00"') == "\U0001F600" and json.loads('"\\ud800"') == "\ud800"
    line = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}, {"role": "assistant", "content": "a"}]}'
    assert reason(line) == "accepted"


def test_the_rust_tokenizer_cannot_take_a_lone_surrogate(chatml_dir):
    """Why the reject exists: encode_batch raises a TypeError that names no line (the whole dataset was lost)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{chatml_dir}/tokenizer.json")
    assert tok.encode_batch(["caf\u00e9"], add_special_tokens=False)[0].ids
    with pytest.raises(TypeError):
        tok.encode_batch(["caf\ud800"], add_special_tokens=False)
