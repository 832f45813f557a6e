"""SGLang benchmark against a fake server subprocess speaking SGLang's HTTP API."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from eagle3.evaluate.sglang_bench import (
    SGLangBenchConfig, SGLangBenchmark, SGLangResponseError, parse_generate, server_accept_length,
    sglang_benchmark,
)
from eagle3.errors import InputError
from eagle3.serving.process import free_port
from tests.evaluate.server_processes import alive

HERE = Path(__file__).parent


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": f"Say {i}"}) for i in range(5)) + "\n")
    return str(p)


def _cfg(tmp_path, tiny_llama_dir, prompts_file, env=None, **kw):
    argv_log = tmp_path / "argv.jsonl"
    server_env = {"PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                  "FAKE_SGLANG_ARGV_LOG": str(argv_log), **(env or {})}
    base = dict(target=tiny_llama_dir, draft=str(tmp_path / "draft"), out=str(tmp_path / "out"),
                prompts=prompts_file, max_new_tokens=20, port=free_port(), module="fake_sglang_server",
                server_env=server_env, health_timeout_s=30, gpus=[3], concurrency=2)
    return SGLangBenchConfig(**{**base, **kw}), argv_log


def test_two_phases_command_lines_tau_and_cross_check(tmp_path, tiny_llama_dir, prompts_file):
    cfg, argv_log = _cfg(tmp_path, tiny_llama_dir, prompts_file, env={"FAKE_SGLANG_ACCEPT": "2.5"})
    summary = sglang_benchmark(cfg)
    runs = [json.loads(x) for x in argv_log.read_text().splitlines()]
    assert len(runs) == 2
    base_argv, spec_argv = runs[0]["argv"], runs[1]["argv"]
    assert "--speculative-algorithm" not in base_argv
    assert base_argv[:2] == ["--model-path", tiny_llama_dir]
    pairs = dict(zip(spec_argv[::2], spec_argv[1::2]))
    assert pairs["--speculative-algorithm"] == "EAGLE3"
    assert pairs["--speculative-draft-model-path"] == cfg.draft
    assert (pairs["--speculative-num-steps"], pairs["--speculative-eagle-topk"],
            pairs["--speculative-num-draft-tokens"]) == ("3", "1", "4")
    assert runs[0]["cuda"] == runs[1]["cuda"] == "3"
    # 20 tokens in ceil(20/2.5) = 8 verifications per prompt
    assert summary["acceptance_length"] == pytest.approx(20 / 8)
    assert summary["server_accept_length"] == pytest.approx(20 / 8)
    assert summary["cross_check"]["agree"] is True
    assert summary["tokens_per_s_spec"] > 0 and summary["tokens_per_s_base"] > 0  # no speed race under load
    assert summary["identical_outputs"] == 5
    report = json.loads(Path(cfg.out, "sglang_report.json").read_text())
    assert report["phases"]["eagle3"]["spec_verify_ct"] == 40
    # both servers are gone
    assert not any(alive(r["pid"]) for r in runs)


def test_parameters_reach_the_command_line(tmp_path, tiny_llama_dir, prompts_file):
    cfg, argv_log = _cfg(tmp_path, tiny_llama_dir, prompts_file, num_steps=5, num_draft_tokens=6, limit=1,
                         extra_args=("--mem-fraction-static", "0.7"))
    sglang_benchmark(cfg)
    spec_argv = json.loads(argv_log.read_text().splitlines()[1])["argv"]
    pairs = dict(zip(spec_argv[::2], spec_argv[1::2]))
    assert pairs["--speculative-num-steps"] == "5" and pairs["--speculative-num-draft-tokens"] == "6"
    assert pairs["--mem-fraction-static"] == "0.7"


def test_server_and_its_children_are_killed_when_generate_fails(tmp_path, tiny_llama_dir, prompts_file):
    children = tmp_path / "children.txt"
    cfg, argv_log = _cfg(tmp_path, tiny_llama_dir, prompts_file,
                         env={"FAKE_SGLANG_FAIL": "generate", "FAKE_SGLANG_CHILD": str(children)})
    with pytest.raises(SGLangResponseError, match="HTTP 500"):
        sglang_benchmark(cfg)
    (run,) = [json.loads(x) for x in argv_log.read_text().splitlines()]  # the second phase never started
    pids = [run["pid"]] + [int(x) for x in children.read_text().split()]
    assert not any(alive(p) for p in pids)


def test_server_failing_at_start_is_reported(tmp_path, tiny_llama_dir, prompts_file):
    from eagle3.serving import ServerFailed

    cfg, _ = _cfg(tmp_path, tiny_llama_dir, prompts_file, env={"FAKE_SGLANG_FAIL": "start"})
    with pytest.raises(ServerFailed, match="failing at start"):
        sglang_benchmark(cfg)


def test_stop_from_another_thread_kills_the_running_server(tmp_path, tiny_llama_dir, prompts_file):
    import threading

    cfg, argv_log = _cfg(tmp_path, tiny_llama_dir, prompts_file, env={"FAKE_SGLANG_STARTUP_S": "60"},
                         health_timeout_s=60)
    bench = SGLangBenchmark(cfg)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(Exception, bench.run)))
    t.start()
    deadline = time.time() + 20
    while not (argv_log.exists() and argv_log.read_text().endswith("\n")) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    bench.stop()  # what an operator's on_kill does
    t.join(timeout=30)
    assert not t.is_alive()
    pid = json.loads(argv_log.read_text().splitlines()[0])["pid"]
    assert not alive(pid)
    assert len(argv_log.read_text().splitlines()) == 1  # no second phase after stop


def test_parse_generate_requires_documented_fields():
    ok = {"text": "hi", "output_ids": [5, 6], "meta_info": {"completion_tokens": 7, "spec_verify_ct": 3,
                                                            "finish_reason": {"type": "length", "length": 7}}}
    assert parse_generate(ok, True, "u") == {"completion_tokens": 7, "prompt_tokens": None, "e2e_latency": None,
                                             "text": "hi", "output_ids": [5, 6], "finish_reason": "length",
                                             "spec_verify_ct": 3}
    with pytest.raises(SGLangResponseError, match="spec_verify_ct"):
        parse_generate({"meta_info": {"completion_tokens": 7}}, True, "u")
    with pytest.raises(SGLangResponseError, match="completion_tokens"):
        parse_generate({"text": "x"}, False, "u")
    assert server_accept_length({"internal_states": [{"avg_spec_accept_length": 2.9}]}) == 2.9
    assert server_accept_length({"internal_states": [{"last_gen_throughput": 1.0}]}) is None


def test_chain_needs_steps_plus_one_draft_tokens(tmp_path):
    with pytest.raises(InputError, match="num_steps \\+ 1"):
        SGLangBenchConfig(target="t", draft="d", out=str(tmp_path), num_steps=3, num_draft_tokens=8)


def test_a_p_eagle_draft_is_refused_naming_its_config(tmp_path):
    """SGLang has no parallel drafter: it would load a P-EAGLE export as a chain draft (skipping mask_hidden)."""
    from eagle3.evaluate.sglang_bench import SGLangBenchmark

    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"parallel_drafting": True, "mask_token_id": 0}))
    cfg = SGLangBenchConfig(target="t", draft=str(draft), out=str(tmp_path / "out"))
    with pytest.raises(InputError, match="parallel_drafting") as err:
        SGLangBenchmark(cfg)
    assert str(draft / "config.json") in str(err.value)
    (draft / "config.json").write_text(json.dumps({"parallel_drafting": False}))
    SGLangBenchmark(cfg)  # a chain draft passes
