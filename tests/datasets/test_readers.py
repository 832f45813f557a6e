"""Every kind of bad input line becomes a Rejected with its 1-based line and reason."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.datasets import readers, records
from eagle3.datasets.readers import Conversation, Rejected, TokenRecord, read_records
from eagle3.errors import InputError

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _lines(path, fmt, **kw):
    return list(read_records(str(path), fmt, **kw))


@pytest.mark.parametrize("line, reason", [
    (b"{not json", records.MALFORMED_JSON),
    (b'{"messages": []}', records.NO_MESSAGES),
    (b'{"other": 1}', records.NO_MESSAGES),
    (b"[1, 2]", records.NOT_OBJECT),
    (json.dumps({"messages": [{"role": "narrator", "content": "x"}]}).encode(), records.UNKNOWN_ROLE),
    (json.dumps({"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "a"}]}).encode(),
     records.EMPTY_CONTENT),
    (json.dumps({"messages": [{"role": "user", "content": "q"}]}).encode(), records.NO_ASSISTANT),
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', records.INVALID_UTF8),
    (json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]}).encode(), records.BAD_TOOLS),
])
def test_bad_message_lines_are_rejected_with_their_line(tmp_path, line, reason):
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\n" + line + b"\n" + json.dumps(GOOD).encode() + b"\n")
    items = _lines(path, "messages")
    assert [type(i) for i in items] == [Conversation, Rejected, Conversation]
    assert (items[1].line, items[1].reason) == (3, reason)  # blank line 2 holds no record
    assert items[2].line == 4


@pytest.mark.parametrize("record, reason", [
    ({"input_ids": [1, 2, 3], "loss_mask": [0, 1]}, records.LENGTH_MISMATCH),
    ({"input_ids": [1, 2], "loss_mask": [0, 2]}, records.MASK_NOT_BINARY),
    ({"input_ids": [-1, 2], "loss_mask": [0, 1]}, records.ID_OUT_OF_RANGE),
    ({"input_ids": [1, 100], "loss_mask": [0, 1]}, records.ID_OUT_OF_RANGE),
    ({"input_ids": [], "loss_mask": []}, records.NO_TOKENS),
    ({"input_ids": [1, 2], "loss_mask": [0, 0]}, records.NO_LOSS_TOKENS),
    ({"input_ids": ["a"], "loss_mask": [1]}, records.BAD_TOKENS),
    ({"input_ids": [1.5, 2], "loss_mask": [0, 1]}, records.BAD_TOKENS),  # never truncated to 1
    ({"input_ids": [True, 2], "loss_mask": [0, 1]}, records.BAD_TOKENS),
    ({"input_ids": [1, [2]], "loss_mask": [0, 1]}, records.BAD_TOKENS),  # simdjson would flatten this
    ({"input_ids": [1, 2**64], "loss_mask": [0, 1]}, records.ID_OUT_OF_RANGE),
    ({"loss_mask": [0, 1]}, records.NO_TOKENS),
])
def test_bad_tokenized_records(tmp_path, record, reason):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"input_ids": [5, 99], "loss_mask": [0, 1]}) + "\n" + json.dumps(record) + "\n")
    items = _lines(path, "tokenized", vocab_size=100)
    assert isinstance(items[0], TokenRecord) and items[0].input_ids.tolist() == [5, 99]
    assert (items[1].line, items[1].reason) == (2, reason)


def test_simdjson_and_json_paths_give_the_same_records(tmp_path, monkeypatch):
    pytest.importorskip("simdjson")
    lines = [json.dumps({"input_ids": [5, 99, 7], "loss_mask": [0, 1, 1]}),
             '{"id": "x", "input_ids":[3,4],"loss_mask":[1,1]}\r',
             json.dumps({"input_ids": [1, 2], "loss_mask": [0, 2]}),
             '{"input_ids": [1, 2], "loss_mask": [0, 1]',
             json.dumps({"input_ids": [1, 2], "loss_mask": [0, 1], "meta": {"tags": ["a"]}}),
             '{"input_ids": [1, 2], "loss_mask": [0, 1], "note": "caf\xe9"}',
             json.dumps({"input_ids": [1, 200], "loss_mask": [1, 1]}),
             '{"input_ids": [1, 2], "loss_mask": [0, 1], "input_ids": null}',  # duplicate key: json keeps the last
             json.dumps({"input_ids": [1, 2], "loss_mask": [False, True]})]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(line.encode("latin-1") for line in lines) + b"\n")
    calls = []
    real = readers._FastTokens.__call__
    monkeypatch.setattr(readers._FastTokens, "__call__", lambda self, raw: calls.append(raw) or real(self, raw))
    fast = _lines(path, "tokenized", vocab_size=100)
    assert len(calls) == 9 and sum(real(readers._FastTokens(), c) is not None for c in calls) == 4
    monkeypatch.setattr(readers._FastTokens, "__call__", lambda self, raw: None)  # json.loads for every line
    slow = _lines(path, "tokenized", vocab_size=100)

    def view(items):
        return [(type(i).__name__, i.line, getattr(i, "reason", None), getattr(i, "input_ids", np.zeros(0)).tolist(),
                 getattr(i, "loss_mask", np.zeros(0)).tolist()) for i in items]
    assert view(fast) == view(slow)
    assert [v[0] for v in view(fast)] == ["TokenRecord", "TokenRecord", "Rejected", "Rejected", "TokenRecord",
                                          "Rejected", "Rejected", "Rejected", "TokenRecord"]
    assert [i.reason for i in fast if isinstance(i, Rejected)] == [
        records.MASK_NOT_BINARY, records.MALFORMED_JSON, records.INVALID_UTF8, records.ID_OUT_OF_RANGE,
        records.NO_TOKENS]
    assert fast[-1].loss_mask.tolist() == [0, 1]  # a boolean mask is a mask


def test_byte_order_mark_on_the_first_line_is_not_a_reject(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"input_ids": [5, 6], "loss_mask": [0, 1]}).encode() + b"\n")
    (item,) = _lines(path, "tokenized", vocab_size=100)
    assert isinstance(item, TokenRecord) and item.input_ids.tolist() == [5, 6]
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    assert isinstance(_lines(path, "messages")[0], Conversation)


def test_parquet_tokenized_with_a_boolean_mask(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[5, 6, 7]], pa.list_(pa.int32())),
                             "loss_mask": pa.array([[False, True, True]], pa.list_(pa.bool_()))}), path)
    (item,) = _lines(path, "tokenized", vocab_size=100)
    assert isinstance(item, TokenRecord) and item.loss_mask.tolist() == [0, 1, 1]


def test_sharegpt_gz_and_parquet_read_the_same(tmp_path):
    rec = {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                             {"from": "gpt", "value": "a"}, {"from": "function_call",
                                                            "value": '{"name": "f", "arguments": {"x": 1}}'},
                             {"from": "observation", "value": "r"}, {"from": "gpt", "value": "b"}]}
    gz = tmp_path / "s.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps(rec) + "\n")
    pq.write_table(pa.table({"conversations": [json.dumps(rec["conversations"])]}), tmp_path / "s.parquet")
    a, = _lines(gz, "sharegpt")
    b, = _lines(tmp_path / "s.parquet", "sharegpt")
    assert a.messages == b.messages
    assert [m["role"] for m in a.messages] == ["system", "user", "assistant", "assistant", "tool", "assistant"]
    assert a.messages[3]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}


def test_parquet_struct_messages_drop_none_fields(tmp_path):
    table = pa.table({"messages": [[{"role": "user", "content": "q", "tool_calls": None},
                                    {"role": "assistant", "content": "a", "tool_calls": None}]]})
    pq.write_table(table, tmp_path / "m.parquet")
    item, = _lines(tmp_path / "m.parquet", "messages")
    assert item.messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def test_reasoning_and_content_parts(tmp_path):
    rec = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        {"role": "assistant", "content": "c", "reasoning": "think"}]}
    (tmp_path / "r.jsonl").write_text(json.dumps(rec) + "\n")
    item, = _lines(tmp_path / "r.jsonl", "messages")
    assert item.messages[0]["content"] == "ab" and item.messages[1]["reasoning_content"] == "think"


def test_missing_empty_and_blank_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        _lines(tmp_path / "nope.jsonl", "messages")
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(InputError, match="is empty"):
        _lines(tmp_path / "e.jsonl", "messages")
    (tmp_path / "b.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no records"):
        _lines(tmp_path / "b.jsonl", "messages")
    (tmp_path / "bad.jsonl.gz").write_text("not gzip")
    with pytest.raises(InputError, match="cannot read"):
        _lines(tmp_path / "bad.jsonl.gz", "messages")


# --- unreadable files: an InputError naming the file, never a traceback (issue 15) ------------------------------
def _gz(tmp_path, lines: int = 2000) -> tuple[str, bytes]:
    data = gzip.compress(b"".join(json.dumps(GOOD).encode() + b"\n" for _ in range(lines)), mtime=0)
    return str(tmp_path / "d.jsonl.gz"), data


@pytest.mark.parametrize("damage", ["truncate", "crc", "not_gzip"])
def test_truncated_or_corrupt_gzip_is_refused_naming_the_file(tmp_path, damage):
    path, data = _gz(tmp_path)
    data = {"truncate": data[: len(data) // 2], "crc": data[:-8] + bytes(8), "not_gzip": b"plain text\n"}[damage]
    open(path, "wb").write(data)
    for read in (lambda: readers.count_records(path, "s3://b/d.jsonl.gz"),
                 lambda: list(read_records(path, "messages", display="s3://b/d.jsonl.gz"))):
        with pytest.raises(InputError, match="truncated or corrupt") as e:
            read()
        assert e.value.file == "s3://b/d.jsonl.gz"


def _parquet(tmp_path, table) -> tuple[str, bytes]:
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    return str(path), path.read_bytes()


MESSAGES_JSON = json.dumps(GOOD["messages"])


@pytest.mark.parametrize("damage, expected", [
    (lambda data: b"this is not parquet", "not a readable Parquet file"),
    (lambda data: data[: len(data) // 2], "not a readable Parquet file"),
    (lambda data: data[:4] + b"\xff" * 8 + data[12:], "cannot be read after row 0"),  # first page header
    (lambda data: data.replace(b"messages", b"\x92essages"), "not a readable Parquet file"),  # was UnicodeDecodeError
])
def test_corrupt_parquet_is_refused_naming_the_file(tmp_path, damage, expected):
    path, data = _parquet(tmp_path, pa.table({"messages": [MESSAGES_JSON] * 3}))
    open(path, "wb").write(damage(data))
    with pytest.raises(InputError, match=expected) as e:
        list(read_records(path, "messages"))
    assert e.value.file == path
    if "after row" not in expected:  # the footer is unreadable: the count the stage takes first says so too
        with pytest.raises(InputError, match=expected):
            readers.count_records(path)


def test_a_parquet_string_that_is_not_utf8_rejects_its_row_only(tmp_path):
    raw = pa.array([MESSAGES_JSON.encode(), b'[{"role": "user", "content": "caf\xe9"}]', MESSAGES_JSON.encode()])
    path, _ = _parquet(tmp_path, pa.table({"messages": raw.view(pa.string())}))  # Arrow does not check UTF-8 here
    items = _lines(path, "messages")
    assert [type(i) for i in items] == [Conversation, Rejected, Conversation]
    assert (items[1].line, items[1].reason) == (2, records.INVALID_UTF8)


def test_parquet_values_that_are_not_json_are_rejected(tmp_path):
    # a binary field in tools reached json.dumps in the template rewrite: TypeError, the dataset lost
    tools = pa.array([[{"name": "f", "blob": b"\x00"}], None])
    path, _ = _parquet(tmp_path, pa.table({"messages": [MESSAGES_JSON] * 2, "tools": tools}))
    items = _lines(path, "messages")
    assert (type(items[0]), items[0].reason) == (Rejected, records.NOT_JSON_VALUE)
    assert isinstance(items[1], Conversation)


def test_a_key_spelled_with_escapes_cannot_make_the_two_paths_disagree(tmp_path, monkeypatch):
    # simdjson took the first "input_ids" and json.loads the last ("input\u005fids" is the same key)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"input_ids": [1, 2], "loss_mask": [0, 1], "input\\u005fids": 5}\n'
                     b'{"input\\u005fids": [1, 2], "loss_mask": [0, 1], "note": "a\\nb"}\n')
    fast = [(type(i).__name__, getattr(i, "reason", None)) for i in _lines(path, "tokenized", vocab_size=100)]
    monkeypatch.setattr(readers._FastTokens, "__call__", lambda self, raw: None)
    slow = [(type(i).__name__, getattr(i, "reason", None)) for i in _lines(path, "tokenized", vocab_size=100)]
    assert fast == slow == [("Rejected", records.BAD_TOKENS), ("TokenRecord", None)]


def test_a_malformed_line_reports_its_own_column_not_a_second_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"messages": [}\r\n')
    bad = [item for item in _lines(path, "messages") if isinstance(item, Rejected)]
    assert len(bad) == 1 and bad[0].line == 2
    assert "line 1 column 15" in bad[0].detail, bad[0].detail  # the line end is not part of the JSON
