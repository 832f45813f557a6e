"""Fuzz the readers and the tokenize stage: no input gives anything but a result or an InputError.

Generated lines mix valid records with wrong JSON types in every field, lone surrogates,
deep nesting, truncated and non-UTF-8 bytes, and duplicate or escaped keys. They are
written as JSONL, JSONL.gz (intact, truncated or with a flipped byte) and Parquet (typed
columns, JSON-string columns, non-UTF-8 strings; truncated, flipped or not Parquet at all).
The property: ``tokenize_dataset`` returns a summary whose accepted + rejected equals the
records in the file, each refused record listed once in rejects.jsonl with its file, 1-based
line and a known reason; or it raises an InputError naming the file. Runs are derandomized
(same examples on every run) and sized to stay well under a minute on 2 cores.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3.datasets import readers, records
from eagle3.datasets.readers import Conversation, Rejected, TokenRecord, read_records
from eagle3.errors import InputError
from eagle3.tokenize.stage import TEMPLATE_ERROR, DatasetConfig, tokenize_dataset

REASONS = {v for k, v in vars(records).items() if k.isupper() and isinstance(v, str)} | {TEMPLATE_ERROR}
VOCAB = 49152  # SmolLM2; the tokenized format is checked against config.json's vocab_size
BOM = b"\xef\xbb\xbf"


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- values -------------------------------------------------------------------------------------------------------
lone_surrogate = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "hi", "<|im_end|>", "<|im_start|>assistant\n", "{{ x }}", "\x00", "😀"]),
    lone_surrogate.map(lambda s: "a" + s),
)
scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | texts
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(texts, kids, max_size=3),
                           max_leaves=6)
depth = st.sampled_from([2, 99, 101, 400, 990, 1100, 5000])
deep_json = st.one_of(depth.map(lambda n: "[" * n + "]" * n), depth.map(lambda n: '{"a":' * n + "1" + "}" * n))
json_texts = json_values.map(json.dumps) | deep_json | texts
roles = st.sampled_from(["user", "assistant", "system", "developer", "tool", "function", "human", "gpt",
                         "function_call", "observation", "narrator"]) | json_values
content = texts | json_values | st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url"]) | json_values, "text": texts | json_values}), max_size=2)
tool_call = st.fixed_dictionaries({}, optional={
    "id": texts | json_values, "type": st.just("function"),
    "function": st.fixed_dictionaries({}, optional={
        "name": st.sampled_from(["f", "get_weather"]) | texts | json_values,
        "arguments": json_texts | json_values | st.dictionaries(texts, json_values, max_size=3)})})
message = st.fixed_dictionaries({"role": roles}, optional={
    "content": content, "tool_calls": st.lists(tool_call, max_size=2) | json_values,
    "reasoning_content": texts | json_values, "thinking": texts | json_values,
    "name": texts | json_values, "tool_call_id": texts | json_values, "from": roles, "value": content})
tools = st.lists(st.dictionaries(texts, json_values, max_size=3), max_size=2) | json_texts | json_values
plain = st.text(min_size=1, max_size=20).filter(str.strip)
FIELD_VALUES = {"role": roles, "from": roles, "content": content, "value": content,
                "tool_calls": st.lists(tool_call, max_size=2) | json_values, "reasoning_content": texts | json_values,
                "thinking": texts | json_values, "name": texts | json_values, "tool_call_id": texts | json_values}


@st.composite
def conversation(draw, key: str) -> object:
    """A valid conversation (tool round trip, reasoning and tools optional); sometimes a lone surrogate
    in one string the template renders; then 0-2 mutations: one field, one message, the tools, the
    message list or the whole record replaced by anything."""
    msgs = [{"role": "user", "content": draw(plain)}, {"role": "assistant", "content": draw(plain)}]
    rec: dict = {key: msgs}
    if draw(st.booleans()):
        args = draw(st.dictionaries(plain, json_values, max_size=3))
        msgs += [{"role": "assistant", "content": "", "tool_calls": [
                     {"id": "c0", "type": "function", "function": {"name": "f", "arguments": args}}]},
                 {"role": "tool", "tool_call_id": "c0", "content": draw(plain)},
                 {"role": "assistant", "content": draw(plain)}]
    if draw(st.booleans()):
        msgs[1]["reasoning_content"] = draw(plain)
    if draw(st.booleans()):
        rec["tools"] = [{"type": "function", "function": {
            "name": "f", "description": draw(plain),
            "parameters": draw(st.dictionaries(plain, json_values, max_size=2))}}]
    if draw(st.integers(0, 3)) == 0:
        bad = "x" + draw(lone_surrogate)
        where = draw(st.sampled_from(["content", "reasoning", "arguments", "tools"]))
        if where == "arguments" and len(msgs) > 2:
            msgs[2]["tool_calls"][0]["function"]["arguments"] = {"city": bad}
        elif where == "tools" and "tools" in rec:
            rec["tools"][0]["function"]["description"] = bad
        elif where == "reasoning":
            msgs[1]["reasoning_content"] = bad
        else:
            msgs[draw(st.integers(0, len(msgs) - 1))]["content"] += bad
    if len(msgs) > 2 and draw(st.booleans()):
        fn = msgs[2]["tool_calls"][0]["function"]
        fn["arguments"] = json.dumps(fn["arguments"])  # OpenAI sends arguments as a JSON string
    if key == "conversations" and draw(st.booleans()):  # ShareGPT's own spelling
        names = {"user": "human", "assistant": "gpt", "tool": "observation"}
        msgs[:] = [m if "tool_calls" in m else {"from": names[m["role"]], "value": m["content"]} for m in msgs]
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(msgs) - 1))
        how = draw(st.sampled_from(["field", "field", "message", "tools", "messages", "record"]))
        if how == "field" and isinstance(msgs[i], dict):
            name = draw(st.sampled_from(sorted(FIELD_VALUES)))
            msgs[i][name] = draw(FIELD_VALUES[name])
        elif how == "message":
            msgs[i] = draw(message | json_values)
        elif how == "tools":
            rec["tools"] = draw(tools)
        elif how == "messages":
            rec[key] = draw(st.lists(message, max_size=4) | st.lists(message, max_size=3).map(json.dumps)
                            | json_texts | json_values)
        elif how == "record":
            return draw(json_values)
    return rec


def _valid_tokens(ids: list[int]) -> dict:
    return {"input_ids": ids, "loss_mask": [k % 2 for k in range(len(ids))][::-1]}


@st.composite
def tokenized_record(draw) -> object:
    """A valid seed-format record, often with one field replaced by anything."""
    rec = _valid_tokens(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)))
    how = draw(st.sampled_from(["keep", "keep", "ids", "mask", "extra", "drop", "record"]))
    if how == "ids":
        rec["input_ids"] = draw(st.lists(st.integers(-3, VOCAB + 3) | st.sampled_from([2**63, 2**64, -2**63 - 1])
                                         | scalars, max_size=6) | json_values)
    elif how == "mask":
        rec["loss_mask"] = draw(st.lists(st.sampled_from([0, 1, 1, 2, -1, True, False]) | scalars, max_size=6)
                                | json_values)
    elif how == "extra":
        rec[draw(texts)] = draw(json_values)
    elif how == "drop":
        del rec[draw(st.sampled_from(["input_ids", "loss_mask"]))]
    elif how == "record":
        return draw(json_values)
    return rec


RECORDS = {"messages": conversation("messages"), "sharegpt": conversation("conversations"),
           "tokenized": tokenized_record()}


# --- lines and files ----------------------------------------------------------------------------------------------
@st.composite
def line_bytes(draw, fmt: str) -> bytes:
    """One JSONL line (no newline) from a generated record, often mutated at the byte level."""
    raw = json.dumps(draw(RECORDS[fmt])).encode()  # ensure_ascii: a lone surrogate is written "\ud800"
    how = draw(st.sampled_from(["keep"] * 12 + ["truncate", "bad_byte", "binary", "deep", "dup_key", "escaped_key"]))
    k = draw(st.integers(0, len(raw)))
    if how == "truncate":
        raw = raw[:k]
    elif how == "bad_byte":
        raw = raw[:k] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + raw[k:]
    elif how == "binary":
        raw = draw(st.binary(max_size=30))
    elif how == "deep":
        n = draw(depth)
        raw = b'{"messages": ' + b"[" * n + b"]" * n + b', "input_ids": ' + b"[" * n + b"]" * n + b"}"
    elif how == "dup_key" and raw.endswith(b"}") and len(raw) > 2:
        raw = raw[:-1] + b', "input_ids": ' + json.dumps(draw(json_values)).encode() + b"}"
    elif how == "escaped_key":
        raw = raw.replace(b'"input_ids"', b'"input\\u005fids"', 1).replace(b'"messages"', b'"mess\\u0061ges"', 1)
    return raw


@st.composite
def jsonl_content(draw, fmt: str) -> bytes:
    lines = draw(st.lists(line_bytes(fmt) | st.sampled_from([b"", b"  ", b"\r"]), min_size=1, max_size=8))
    data = b"\n".join(lines) + draw(st.sampled_from([b"\n", b""]))
    return (BOM if draw(st.booleans()) else b"") + data


def count_lines(data: bytes) -> tuple[int, int]:
    """(records, physical lines) by the contract: a line is a record unless blank; a first-line BOM is no text."""
    lines = data.split(b"\n")
    if lines[0].startswith(BOM):
        lines[0] = lines[0][3:]
    return sum(1 for x in lines if x.strip()), len(lines)


def gunzip(data: bytes) -> bytes | None:
    try:
        with gzip.open(io.BytesIO(data), "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error):
        return None


@st.composite
def gz_file(draw, fmt: str) -> bytes:
    data = gzip.compress(draw(jsonl_content(fmt)), mtime=0)
    how = draw(st.sampled_from(["keep", "keep", "truncate", "flip"]))
    k = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:k]
    if how == "flip":
        return data[:k] + bytes([data[k] ^ (1 << draw(st.integers(0, 7)))]) + data[k + 1:]
    return data


def parquet_bytes(rows: list, fmt: str, odd_row: str) -> bytes:
    """Typed columns when Arrow can infer and write them, else each field as a JSON string (as many
    datasets store them). ``odd_row`` "utf8": the first row gets a string that is not UTF-8;
    "binary": the first row's tools hold bytes (a value JSON does not have)."""
    rows = [r if isinstance(r, dict) else {"messages" if fmt != "tokenized" else "input_ids": r} for r in rows]

    def typed():
        return pa.Table.from_pylist(rows) if rows else pa.table({"messages": pa.array([], pa.string())})

    def json_strings():
        keys = sorted({k for r in rows for k in r})
        name = {k: k.encode("utf-8", "backslashreplace").decode() for k in keys}  # column names must be UTF-8
        return pa.table({name[k]: pa.array([json.dumps(r[k]) if k in r else None for r in rows], pa.string())
                         for k in keys} or {"x": pa.array([None] * len(rows), pa.null())})

    for build in (typed, json_strings):
        try:
            table = build()
            if odd_row != "none" and table.num_rows:
                first = [b"\xff\xfe" if odd_row == "utf8" else b"\x00\x01"] + [None] * (table.num_rows - 1)
                if odd_row == "utf8":  # Arrow does not check UTF-8 in a view
                    column = pa.array(first, pa.binary()).view(pa.string())
                else:
                    column = pa.array([[{"name": "f", "blob": b}] if b else None for b in first])
                table = table.append_column("note" if odd_row == "utf8" else "tools", column)
            buf = io.BytesIO()
            pq.write_table(table, buf)
            return buf.getvalue()
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            if build is json_strings:
                raise
    raise AssertionError("unreachable")


@st.composite
def parquet_file(draw, fmt: str) -> tuple[bytes, bool]:
    """(file bytes, intact): an intact file must be read; a damaged one may be refused."""
    rows = draw(st.lists(RECORDS[fmt], max_size=6))
    data = parquet_bytes(rows, fmt, odd_row=draw(st.sampled_from(["none", "none", "none", "utf8", "binary"])))
    how = draw(st.sampled_from(["keep"] * 4 + ["truncate", "flip", "not_parquet"]))
    k = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:k], False
    if how == "flip":
        return data[:k] + bytes([data[k] ^ 0xFF]) + data[k + 1:], False
    if how == "not_parquet":
        head = draw(st.sampled_from([b"PAR1", b"PAR1" + b"\x00" * 8 + b"PAR1", b"", b"{}"]))
        return head + draw(st.binary(max_size=40)), False
    return data, True


def footer_rows(data: bytes) -> int | None:
    try:
        return pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
    except (pa.ArrowException, OSError, ValueError):
        return None


# --- the property -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def check_stage(tok_dir: str, workdir: Path, fmt: str, ext: str, data: bytes, records_expected: int | None,
                max_line: int, damaged: bool = False) -> None:
    """Tokenize ``data`` as ``fmt``. ``records_expected`` None: the file cannot be read, so it must be
    refused; ``damaged``: it may also be refused (a corrupt Parquet page behind a readable footer)."""
    run = Path(tempfile.mkdtemp(dir=workdir))
    try:
        src = run / f"data{ext}"
        src.write_bytes(data)
        cfg = DatasetConfig(name="fz", source=str(src), format=fmt, tokenizer=tok_dir, out=str(run / "prep"),
                             max_reject_share=1.0, batch_size=3, force=True)
        rejects_path = run / "prep" / "fz" / "rejects.jsonl"
        try:
            summary = tokenize_dataset(cfg)
        except InputError as e:
            assert e.file == str(src), f"InputError does not name the file: {e}"
            if rejects_path.exists():  # refused because no record was accepted: every one is listed
                rejects = [json.loads(x) for x in rejects_path.read_text().split("\n") if x]
                assert records_expected is not None and len(rejects) == records_expected, e
                check_rejects(rejects, str(src), max_line)
            else:  # refused as a file: unreadable, or it holds no record at all
                assert damaged or records_expected in (None, 0), f"readable file with {records_expected} records " \
                                                                 f"refused: {e}"
            return
        assert records_expected is not None, "an unreadable file gave a result"
        assert summary["samples"] + summary["rejected"] == records_expected
        rejects = [json.loads(x) for x in rejects_path.read_text().split("\n") if x]
        assert len(rejects) == summary["rejected"]
        check_rejects(rejects, str(src), max_line)
    finally:
        shutil.rmtree(run, ignore_errors=True)


def check_rejects(rejects: list[dict], src: str, max_line: int) -> None:
    assert all(r["file"] == src and r["reason"] in REASONS and 1 <= r["line"] <= max_line for r in rejects), rejects
    assert len({r["line"] for r in rejects}) == len(rejects), "a record was refused twice"


FORMATS = ["messages", "sharegpt", "tokenized"]


@pytest.mark.parametrize("fmt", FORMATS)
@fuzz(40)
@given(st.data())
def test_stage_on_fuzzed_jsonl(chatml_dir, workdir, fmt, data):
    content = data.draw(jsonl_content(fmt))
    n, lines = count_lines(content)
    check_stage(chatml_dir, workdir, fmt, ".jsonl", content, n, lines)


@pytest.mark.parametrize("fmt", FORMATS)
@fuzz(30)
@given(st.data())
def test_stage_on_fuzzed_gzip(chatml_dir, workdir, fmt, data):
    content = data.draw(gz_file(fmt))
    plain_content = gunzip(content)  # None: truncated or corrupt, so it must be refused
    n, lines = count_lines(plain_content) if plain_content is not None else (None, 0)
    check_stage(chatml_dir, workdir, fmt, ".jsonl.gz", content, n, lines)


@pytest.mark.parametrize("fmt", FORMATS)
@fuzz(30)
@given(st.data())
def test_stage_on_fuzzed_parquet(chatml_dir, workdir, fmt, data):
    content, intact = data.draw(parquet_file(fmt))
    n = footer_rows(content)  # a result must account for every row the footer declares
    check_stage(chatml_dir, workdir, fmt, ".parquet", content, n, n or 0, damaged=not intact)


@pytest.mark.parametrize("fmt", FORMATS)
@fuzz(150)
@given(st.data())
def test_readers_on_fuzzed_lines(workdir, fmt, data):
    """Every item is a record or a reject with its line; accepted conversations are safe to render and encode."""
    content = data.draw(jsonl_content(fmt))
    src = workdir / f"r-{fmt}.jsonl"
    src.write_bytes(content)
    n, lines = count_lines(content)
    try:
        items = list(read_records(str(src), fmt, vocab_size=VOCAB))
    except InputError as e:
        assert n == 0 and e.file == str(src)
        return
    assert len(items) == n and [i.line for i in items] == sorted({i.line for i in items})
    for item in items:
        assert 1 <= item.line <= lines
        if isinstance(item, Rejected):
            assert item.reason in REASONS
            item.detail.encode("utf-8")  # rejects.jsonl is UTF-8
        elif isinstance(item, Conversation):
            json.dumps([item.messages, item.tools], ensure_ascii=False).encode("utf-8")  # JSON, no surrogates
            assert all(isinstance(m["content"], str) for m in item.messages)
        else:
            assert isinstance(item, TokenRecord) and item.input_ids.dtype == np.int32


def _view(items):
    return [(type(i).__name__, i.line, getattr(i, "reason", None), getattr(i, "input_ids", np.zeros(0)).tolist(),
             getattr(i, "loss_mask", np.zeros(0)).tolist()) for i in items]


@fuzz(200)
@given(content=jsonl_content("tokenized"))
def test_simdjson_and_json_paths_agree_on_fuzzed_lines(workdir, content):
    pytest.importorskip("simdjson")
    src = workdir / "paths.jsonl"
    src.write_bytes(content)
    try:
        fast = _view(read_records(str(src), "tokenized", vocab_size=VOCAB))
    except InputError:
        return  # no records
    real, readers._FastTokens.__call__ = readers._FastTokens.__call__, lambda self, raw: None
    try:
        slow = _view(read_records(str(src), "tokenized", vocab_size=VOCAB))
    finally:
        readers._FastTokens.__call__ = real
    assert fast == slow
