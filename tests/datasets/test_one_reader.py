"""Every stage that reads a dataset accepts and refuses it the same way (eagle3.datasets).

The same bad inputs go through tokenize's reader (``readers.read_records``), regenerate's
(``conversations.read_conversations``), and, for manifests, through discover, tokenize,
regenerate, merge and the DAG's Asset list. Records: both readers refuse the same lines for
the same reason, and accept the others with the same messages. The two stage rules are the
only differences, and they are asserted as such: tokenize needs an assistant turn (something
to learn), regenerate a user turn (something to answer).
"""

from __future__ import annotations

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.datasets import records
from eagle3.datasets.manifest import load_manifest, source_uris
from eagle3.datasets.readers import Rejected, read_records
from eagle3.errors import InputError
from eagle3.regenerate.conversations import NO_USER, BadRecord, read_conversations

U, A = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}


def _msgs(*messages, **extra) -> bytes:
    return json.dumps({"messages": list(messages), **extra}).encode()


def _share(*turns) -> bytes:
    return json.dumps({"conversations": [{"from": f, "value": v} for f, v in turns]}).encode()


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}
DEEP = {"x": 1}
for _ in range(records.MAX_DEPTH + 2):
    DEEP = {"x": DEEP}

# (format, line, the reason both readers refuse it with)
REFUSED = [
    ("messages", b"{not json", records.MALFORMED_JSON),
    ("messages", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', records.INVALID_UTF8),
    ("messages", b"[1, 2]", records.NOT_OBJECT),
    ("messages", b'{"messages": []}', records.NO_MESSAGES),
    ("messages", b'{"other": 1}', records.NO_MESSAGES),
    ("messages", b'{"messages": "[not json"}', records.MALFORMED_JSON),
    ("messages", b'{"messages": ["hi"]}', records.NOT_OBJECT),
    ("messages", _msgs({"role": "wizard", "content": "x"}, U, A), records.UNKNOWN_ROLE),
    ("messages", _msgs({"role": "user", "content": "  "}, A), records.EMPTY_CONTENT),
    ("messages", _msgs(U, {"role": "assistant", "content": ""}), records.EMPTY_CONTENT),
    ("messages", _msgs({"role": "user", "content": 5}, A), records.BAD_CONTENT),
    ("messages", _msgs({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, A),
     records.BAD_CONTENT),
    ("messages", _msgs(U, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "{bad"}}]}), records.BAD_TOOLS),
    ("messages", _msgs(U, {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}), records.BAD_TOOLS),
    ("messages", _msgs(U, A, tools={"not": "a list"}), records.BAD_TOOLS),
    ("messages", _msgs(U, {"role": "assistant", "content": "a", "reasoning_content": 3}), records.BAD_CONTENT),
    ("messages", b'{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "a"}]}',
     records.LONE_SURROGATE),
    ("messages", _msgs(U, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": DEEP}}]}), records.TOO_DEEP),
    ("sharegpt", _share(("alien", "x"), ("human", "q"), ("gpt", "a")), records.UNKNOWN_ROLE),
    ("sharegpt", _share(("human", ""), ("gpt", "a")), records.EMPTY_CONTENT),
    ("sharegpt", _share(("human", "q"), ("function_call", "not json")), records.BAD_TOOLS),
    ("sharegpt", b'{"conversations": []}', records.NO_MESSAGES),
]

# (format, line): accepted by both, with the same messages (the aliases of both former readers)
ACCEPTED = [
    ("messages", _msgs({"role": "developer", "content": "be brief"}, U, A)),
    ("messages", _msgs(U, {"role": "assistant", "content": "", "tool_calls": [CALL]},
                       {"role": "function", "content": "1", "name": "f"}, A)),
    ("messages", _msgs(U, {"role": "assistant", "content": "", "tool_calls": [CALL]},
                       {"role": "tool", "content": "1", "tool_call_id": "c1"}, A,
                       tools=json.dumps([{"type": "function", "function": {"name": "f"}}]))),
    ("messages", _msgs(U, {"role": "assistant", "content": "a", "reasoning": "because"})),
    ("messages", _msgs(U, {"role": "assistant", "content": "a", "thinking": "hmm", "reasoning": True})),
    ("messages", _msgs({"role": "user", "content": [{"type": "text", "text": "q1 "}, {"text": "q2"}]}, A)),
    ("messages", _msgs({"from": "user", "content": "q"}, A)),
    ("messages", json.dumps({"messages": json.dumps([U, A])}).encode()),
    ("sharegpt", _share(("system", "s"), ("human", "q"), ("gpt", "a"), ("human", "q2"), ("chatgpt", "b"))),
    ("sharegpt", _share(("Human", "q"), ("GPT", "a"))),
    ("sharegpt", _share(("human", "q"), ("bing", "a"), ("user", "q2"), ("bard", "b"))),
    ("sharegpt", _share(("human", "q"), ("function_call", '{"name": "f", "arguments": {"x": 1}}'),
                        ("observation", "1"), ("function_response", "2"), ("function", "3"), ("gpt", "a"))),
    ("sharegpt", json.dumps({"conversations": [{"role": "user", "content": "q"}, A]}).encode()),
]

GOOD = _msgs(U, A)


def _tokenize_view(path, fmt):
    """line -> ("refused", reason) | ("accepted", messages, tools), as tokenize reads the file."""
    return {item.line: ("refused", item.reason) if isinstance(item, Rejected) else
            ("accepted", item.messages, item.tools) for item in read_records(str(path), fmt)}


def _unwire(message):
    """Regenerate sends tool-call arguments as JSON strings (the OpenAI wire format); tokenize keeps dicts."""
    if "tool_calls" not in message:
        return message
    calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _regenerate_view(path, fmt):
    return {line: ("refused", item.reason) if isinstance(item, BadRecord) else
            ("accepted", [_unwire(m) for m in item.messages], item.tools)
            for line, item in read_conversations(str(path), fmt)}


def _write(tmp_path, line: bytes, name="d.jsonl"):
    path = tmp_path / name
    path.write_bytes(GOOD + b"\n" + line + b"\n" + GOOD + b"\n")
    return path


@pytest.mark.parametrize("fmt, line, reason", REFUSED)
def test_both_readers_refuse_the_same_records_for_the_same_reason(tmp_path, fmt, line, reason):
    path = _write(tmp_path, line)
    tok, regen = _tokenize_view(path, fmt), _regenerate_view(path, fmt)
    assert tok[2] == regen[2] == ("refused", reason)
    assert tok[1][0] == tok[3][0] == regen[1][0] == regen[3][0] == "accepted"


@pytest.mark.parametrize("fmt, line", ACCEPTED)
def test_both_readers_accept_the_same_records_with_the_same_messages(tmp_path, fmt, line):
    tok, regen = _tokenize_view(_write(tmp_path, line), fmt), _regenerate_view(_write(tmp_path, line), fmt)
    assert tok[2][0] == "accepted", tok[2]
    assert regen[2] == tok[2]


def test_reasoning_keys_and_aliases_normalise_alike(tmp_path):
    """Spot checks of what both readers produce (an oracle written out by hand)."""
    tok = _tokenize_view(_write(tmp_path, ACCEPTED[4][1]), "messages")
    assert tok[2][1][1] == {"role": "assistant", "content": "a", "reasoning_content": "hmm"}
    tok = _tokenize_view(_write(tmp_path, ACCEPTED[10][1]), "sharegpt")
    assert [m["role"] for m in tok[2][1]] == ["user", "assistant", "user", "assistant"]


def test_the_stage_rules_are_the_only_differences(tmp_path):
    """tokenize needs an assistant turn to learn from; regenerate needs a user turn to answer."""
    path = _write(tmp_path, _msgs({"role": "system", "content": "s"}, U))  # a prompt-only record
    assert _tokenize_view(path, "messages")[2] == ("refused", records.NO_ASSISTANT)
    assert _regenerate_view(path, "messages")[2][0] == "accepted"
    path = _write(tmp_path, _msgs({"role": "system", "content": "s"}, A))  # nothing to answer
    assert _tokenize_view(path, "messages")[2][0] == "accepted"
    assert _regenerate_view(path, "messages")[2] == ("refused", NO_USER)
    with pytest.raises(InputError, match="cannot be regenerated"):
        list(read_conversations(str(path), "tokenized"))


def test_parquet_rows_read_alike(tmp_path):
    path = tmp_path / "d.parquet"
    rows = [[U, A], [{"role": "user", "content": "q", "name": None}, {"role": "wizard", "content": "x"}],
            [{"role": "user", "content": "q"}]]
    pq.write_table(pa.table({"messages": rows}), path)
    tok, regen = _tokenize_view(path, "messages"), _regenerate_view(path, "messages")
    assert tok[1] == regen[1] and tok[1][0] == "accepted"
    assert tok[2] == regen[2] == ("refused", records.UNKNOWN_ROLE)
    assert tok[3] == ("refused", records.NO_ASSISTANT) and regen[3][0] == "accepted"  # the stage rules


def _bad_files(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\n  \n")
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(GOOD * 50)[:-20])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    return ["missing.jsonl", "empty.jsonl", "blank.jsonl", "cut.jsonl.gz", "junk.parquet"]


def test_both_readers_refuse_the_same_files_naming_them(tmp_path):
    for name in _bad_files(tmp_path):
        path = str(tmp_path / name)
        with pytest.raises(InputError) as tok:
            list(read_records(path, "messages"))
        with pytest.raises(InputError) as regen:
            list(read_conversations(path, "messages"))
        assert str(tok.value) == str(regen.value) and name in str(tok.value)


# --- the manifest: discover, tokenize, regenerate, merge and the DAG read it alike ----------------------

BAD_MANIFESTS = [
    ("datasets:\n  - {name: a, source: a.jsonl, format: chatml}\n", "not a known format"),
    ("datasets:\n  - {name: a, source: a.jsonl, format: messages, colour: red}\n", "unknown key"),
    ("datasets:\n  - {name: ../up, source: a.jsonl, format: messages}\n", "is not allowed"),
    ("datasets:\n  - {name: a, source: a.txt, format: messages}\n", "must end with"),
    ("datasets:\n  - {name: a, source: a.jsonl, format: messages}\n  - {name: a, source: a.jsonl, "
     "format: messages}\n", "duplicates"),
    ("datasets: [\n", "not valid YAML"),
    ("sets: []\n", "top-level 'datasets:'"),
]


def _stage_readers(manifest: str, out: str):
    """Each stage's entry point, run only as far as it reads the manifest (a bad one stops it there)."""
    from eagle3.discover import DiscoverConfig, discover
    from eagle3.merge.config import MergeConfig
    from eagle3.regenerate import RegenerateConfig, regenerate
    from eagle3.tokenize import TokenizeConfig, tokenize

    return {
        "discover": lambda: discover(DiscoverConfig(manifest=manifest, root=out)),
        "tokenize": lambda: tokenize(TokenizeConfig(manifest=manifest, model="unused", out=out)),
        "regenerate": lambda: regenerate(RegenerateConfig(manifest=manifest, out=out, backend="openai",
                                                          base_url="http://127.0.0.1:9")),
        "merge": lambda: MergeConfig(prepared=out, out=out, manifest=manifest).resolved(),
    }


@pytest.mark.parametrize("text, expected", BAD_MANIFESTS)
def test_every_stage_refuses_the_same_manifests_with_the_same_error(tmp_path, text, expected):
    (tmp_path / "a.jsonl").write_bytes(GOOD + b"\n")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(text)
    errors = {}
    for stage, call in _stage_readers(str(manifest), str(tmp_path / "out")).items():
        with pytest.raises(InputError) as e:
            call()
        errors[stage] = str(e.value)
    assert len(set(errors.values())) == 1, errors
    assert expected in errors["discover"]
    assert source_uris(str(manifest)) == []  # the DAG parses on, with no dataset Assets


def test_a_missing_source_stops_the_stages_that_read_sources(tmp_path):
    """discover, tokenize and regenerate read the sources; merge and the DAG read only the manifest."""
    manifest = tmp_path / "m.yaml"
    manifest.write_text("datasets:\n  - {name: a, source: gone.jsonl, format: messages, regenerate: true}\n")
    stages = _stage_readers(str(manifest), str(tmp_path / "out"))
    for stage in ("discover", "tokenize", "regenerate"):
        with pytest.raises(InputError, match="gone.jsonl does not exist"):
            stages[stage]()
    assert stages["merge"]().datasets == ("a",)
    assert source_uris(str(manifest)) == [("a", f"file://{tmp_path}/gone.jsonl")]


def test_relative_sources_resolve_alike_for_the_stages_and_the_dag(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(GOOD + b"\n")
    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "m.yaml").write_text("datasets:\n  - {name: a, source: ../data/a.jsonl, format: messages}\n"
                                "  - {name: b, source: 's3://bkt/b.jsonl', format: sharegpt}\n")
    monkeypatch.chdir(data)  # relative to the manifest's folder, never the working directory
    specs = load_manifest(str(sub / "m.yaml"), check_sources=False)
    assert [s.source for s in specs] == [str(data / "a.jsonl"), "s3://bkt/b.jsonl"]
    assert source_uris(str(sub / "m.yaml")) == [("a", f"file://{data}/a.jsonl"), ("b", "s3://bkt/b.jsonl")]
    assert os.path.isfile(specs[0].source)


def test_the_dag_asset_list_reads_no_s3_manifest_and_no_missing_one(tmp_path):
    assert source_uris("s3://bucket/m.yaml") == []
    assert source_uris(str(tmp_path / "none.yaml")) == []
