"""Benchmark prompts: HumanEval from the installed package, user JSONL, errors naming file and line."""

from __future__ import annotations

import gzip
import json

import pytest

from eagle3.errors import InputError
from eagle3.evaluate.prompts import encode_prompt, load_prompt_sets, load_prompts


def test_humaneval_from_the_package():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164 and prompts[0].id == "HumanEval/0"
    assert "def has_close_elements" in prompts[0].messages[-1]["content"]
    assert [p.id for p in load_prompts("humaneval", limit=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_bundled_chat_set_is_held_out_of_the_demo_corpus():
    from eagle3.demo.corpus import DATASETS, _records

    chat = load_prompts("chat")
    assert len(chat) == 30 and all(p.messages[-1]["role"] == "user" for p in chat)
    trained = {m["content"] for name in DATASETS for r in _records(name, 200, 42)
               for m in r.get("messages", []) if m["role"] == "user"}
    assert not trained & {p.messages[-1]["content"] for p in chat}


def test_prompt_sets_keep_order_and_limit_each(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(5)))
    sets = load_prompt_sets(f"humaneval, {p}", limit=2)
    assert list(sets) == ["humaneval", str(p)]  # the first is the headline set
    assert [x.id for x in sets[str(p)]] == ["mine.jsonl:1", "mine.jsonl:2"] and len(sets["humaneval"]) == 2
    with pytest.raises(InputError, match="names a set twice"):
        load_prompt_sets("chat,chat")
    with pytest.raises(InputError, match="names no prompt set"):
        load_prompt_sets(" , ")


def test_jsonl_prompt_and_messages(tmp_path):
    p = tmp_path / "p.jsonl.gz"
    lines = [{"prompt": "hi"}, {},
             {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
                           {"role": "assistant", "content": "4"}]}]
    p.write_bytes(gzip.compress("\n".join(json.dumps(x) if x else "" for x in lines).encode()))
    got = load_prompts(str(p))
    assert [g.id for g in got] == ["p.jsonl.gz:1", "p.jsonl.gz:3"]  # blank line skipped
    assert got[1].messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"})


@pytest.mark.parametrize("line,match", [
    ("{not json", "p.jsonl:2: not valid JSON"),
    ('{"text": "x"}', 'p.jsonl:2: each line must be a JSON object with a string "prompt"'),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "p.jsonl:2: .*must contain a user turn"),
])
def test_bad_lines_name_file_and_line(tmp_path, line, match):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(InputError, match=match):
        load_prompts(str(p))


def test_missing_file_and_bad_limit(tmp_path):
    with pytest.raises(InputError, match="neither 'humaneval' nor an existing JSONL"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="--limit 0"):
        load_prompts("humaneval", limit=0)


def test_chat_template_applied(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = encode_prompt(tok, load_prompts("humaneval", limit=1)[0])
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")


def test_a_prompt_file_that_does_not_decode_is_named_with_its_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xff"}\n')
    with pytest.raises(InputError, match=r"p.jsonl:2: not UTF-8 \(byte 15: b'\\xff'\)"):
        load_prompts(str(bad))
    gz = tmp_path / "p.jsonl.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(InputError, match=r"p.jsonl.gz: not a readable gzip file .*gzip -t"):
        load_prompts(str(gz))
    # U+2028 is a line break to str.splitlines, but JSON (json.dumps(..., ensure_ascii=False)) keeps it raw
    ok = tmp_path / "u.jsonl"
    ok.write_text(json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_prompts(str(ok))[0].messages[-1]["content"] == "a\u2028b"
