"""The SGLang operators' lifecycle, run as operators against a fake `sglang.launch_server`.

The fake (tests/evaluate/fake_sglang_server.py) speaks SGLang's /health, /generate,
/get_server_info and the OpenAI /v1/chat/completions; it logs its argv and pid, so a
test can check the command lines and that no server outlives its task.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.evaluate.server_processes import alive, free_port

FAKE_DIR = Path(__file__).resolve().parents[1] / "evaluate"


@pytest.fixture
def fake_sglang(monkeypatch, tmp_path):
    """Servers started by the operators run the fake module; returns the argv log path."""
    argv_log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("FAKE_SGLANG_ARGV_LOG", str(argv_log))
    monkeypatch.setenv("AIRFLOW_CONN_EAGLE3_S3", "aws://")  # no S3 here; the operator must still find it
    return argv_log


def _runs(argv_log: Path) -> list[dict]:
    return [json.loads(x) for x in argv_log.read_text().splitlines()] if argv_log.exists() else []


def _prompts(tmp_path) -> str:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Say {i}"}) + "\n" for i in range(3)))
    return str(p)


def test_benchmark_operator_runs_both_servers_and_stops_them(fake_sglang, tmp_path, tiny_llama_dir):
    from operators.sglang import SGLangBenchmarkOperator

    op = SGLangBenchmarkOperator(task_id="sglang_benchmark", target=tiny_llama_dir, draft=str(tmp_path / "draft"),
                                 out=str(tmp_path / "eval"), prompts=_prompts(tmp_path), limit="3",
                                 max_new_tokens="12", port=free_port(), speculative_num_steps=4,
                                 speculative_num_draft_tokens=5, server_module="fake_sglang_server")
    summary = op.execute(context={})
    base, spec = _runs(fake_sglang)
    pairs = dict(zip(spec["argv"][::2], spec["argv"][1::2]))
    assert "--speculative-algorithm" not in base["argv"] and pairs["--speculative-algorithm"] == "EAGLE3"
    assert (pairs["--speculative-num-steps"], pairs["--speculative-num-draft-tokens"]) == ("4", "5")
    assert summary["acceptance_length"] == pytest.approx(12 / 5)  # the fake accepts 2.5 per verification
    assert summary["cross_check"]["agree"] is True and summary["num_prompts"] == 3
    assert json.loads((tmp_path / "eval" / "sglang_report.json").read_text())["identical_outputs"] == 3
    assert not alive(base["pid"]) and not alive(spec["pid"])


def test_benchmark_operator_on_kill_stops_a_starting_server(fake_sglang, tmp_path, tiny_llama_dir, monkeypatch):
    from operators.sglang import SGLangBenchmarkOperator

    monkeypatch.setenv("FAKE_SGLANG_STARTUP_S", "120")  # /health stays 503: the task waits
    op = SGLangBenchmarkOperator(task_id="sglang_benchmark", target=tiny_llama_dir, draft=str(tmp_path / "d"),
                                 out=str(tmp_path / "eval"), prompts=_prompts(tmp_path), port=free_port(),
                                 server_module="fake_sglang_server")
    failures: list[BaseException] = []

    def run():
        try:
            op.execute(context={})
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            failures.append(e)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 30
    while not _runs(fake_sglang) and time.time() < deadline:
        time.sleep(0.1)
    (started,) = _runs(fake_sglang)
    assert alive(started["pid"])
    op.on_kill()  # what Airflow calls when the task is stopped from the UI
    t.join(timeout=30)
    assert not t.is_alive() and failures, "execute must end with an error after on_kill"
    assert not alive(started["pid"])
    assert len(_runs(fake_sglang)) == 1  # no EAGLE3 phase after the kill
    assert not (tmp_path / "eval" / "sglang_report.json").exists()


def test_regenerate_operator_serves_and_uses_its_own_server(fake_sglang, tmp_path, tiny_llama_dir):
    from operators.sglang import SGLangRegenerateOperator

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                                     {"role": "assistant", "content": "old"}]}) + "\n"
                            for i in range(3)))
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(f"datasets:\n  - name: chat\n    source: {data}\n    format: messages\n    regenerate: true\n")
    op = SGLangRegenerateOperator(task_id="regenerate", dataset_name="chat", manifest=str(manifest),
                                  model=tiny_llama_dir, storage_root=str(tmp_path / "root"), port=free_port(),
                                  server_module="fake_sglang_server", concurrency=2)
    stats = op.execute(context={})
    (server,) = _runs(fake_sglang)
    assert server["argv"][:2] == ["--model-path", tiny_llama_dir]
    assert not alive(server["pid"])
    out = [json.loads(x) for x in (tmp_path / "root" / "regenerated" / "chat" / "regenerated.jsonl")
           .read_text().splitlines()]
    assert sorted(r["messages"][-1]["content"] for r in out) == [f"fake answer to: question {i}" for i in range(3)]
    assert (stats["conversations"], stats["done"], stats["failed"], stats["complete"]) == (3, 3, 0, True)
