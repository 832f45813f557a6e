"""vLLM as an evaluate backend, against a fake vLLM (tests/evaluate/fake_vllm: a real subprocess speaking
/health, /v1/completions, /metrics under vLLM's names): the metric arithmetic, the lifecycle (both servers
stopped, their children too, also on stop()), the lossless gate on token ids, the draft-load error."""

from __future__ import annotations

import json
import struct
import sys
import threading
import time
from pathlib import Path

import pytest
from server_processes import alive

from eagle3.errors import GateFailed, InputError
from eagle3.evaluate import EvaluateConfig, evaluate
from eagle3.evaluate.vllm_bench import VLLMBenchmark, counts_between, parse_metrics
from eagle3.serving import ServerFailed
from eagle3.serving.vllm import VLLMServer, draft_blame

FAKE = Path(__file__).resolve().parent / "fake_vllm"

METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 2.0
vllm:num_requests_running{engine="0",model_name="t"} 0.0
"""


def test_metrics_reduce_to_the_per_prompt_record_hand_computed():
    from eagle3.acceptance import rates_of, tau_of

    before = parse_metrics("")
    after = parse_metrics(METRICS)
    assert after["drafts"] == 10 and after["accepted"] == 14 and after["per_position"] == {0: 8, 1: 4, 2: 2}
    c = counts_between(before, after, 3)
    # 10 verifications; 8 accepted the 1st token, 4 of those the 2nd, 2 the 3rd.
    assert c == {"verifications": 10, "emitted": 24, "reached": [10, 8, 4], "accepted": [8, 4, 2]}
    assert tau_of([c]) == pytest.approx(1 + 14 / 10)  # vLLM's own τ = 1 + accepted / drafts
    assert rates_of([c]) == [0.8, 0.5, 0.5]


def test_command_and_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")  # the caller's setting wins over the default
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").mkdir()
    (venv / "bin" / "python").touch()
    (venv / "lib" / "libiomp5.so").touch()
    s = VLLMServer("/m", port=8123, python=str(venv / "bin" / "python"),
                   speculative={"method": "eagle3", "model": "/d", "num_speculative_tokens": 3})
    cmd = s.command()
    assert cmd[:3] == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "/m" and cmd[cmd.index("--port") + 1] == "8123"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {"method": "eagle3", "model": "/d",
                                                                       "num_speculative_tokens": 3}
    env = s.server_env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["LD_PRELOAD"].endswith(str(venv / "lib" / "libiomp5.so"))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and env["VLLM_CACHE_ROOT"].endswith("eagle3/vllm")
    with pytest.raises(InputError, match="--port"):
        VLLMServer("/m", python="python", extra_args=["--port", "1"])
    monkeypatch.setenv("EAGLE3_VLLM_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(InputError, match="make vllm"):
        VLLMServer("/m")


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """The fake answers as vLLM; returns the file where each start records its argv and pid."""
    import os

    record = tmp_path / "starts.jsonl"
    monkeypatch.setenv("EAGLE3_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", f"{FAKE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    monkeypatch.setenv("FAKE_VLLM_CHILD", str(tmp_path / "children.txt"))
    return record


def _starts(record: Path) -> list[dict]:
    return [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []


def _pids(record: Path) -> list[int]:
    children = record.parent / "children.txt"
    return [s["pid"] for s in _starts(record)] + ([int(x) for x in children.read_text().split()]
                                                    if children.exists() else [])


@pytest.fixture
def prompts(tmp_path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Say hi.", "Count to 3.", "Name a fruit.")))
    return str(path)


def _cfg(tmp_path, model, draft, prompts, **kw) -> EvaluateConfig:
    return EvaluateConfig(model=model, draft=draft, out=str(tmp_path / "eval"), prompts=prompts, backend="vllm",
                          max_new_tokens=10, steps=3, precision="float32", **kw)


def test_evaluate_on_vllm_reads_tau_from_the_counters_and_stops_both_servers(
        fake_vllm, tmp_path, tiny_llama_dir, make_draft, prompts):
    draft = make_draft(tiny_llama_dir, tmp_path / "draft")
    summary = evaluate(_cfg(tmp_path, tiny_llama_dir, draft, prompts))
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    base, spec = _starts(fake_vllm)
    assert "--speculative-config" not in base["argv"]
    assert json.loads(spec["argv"][spec["argv"].index("--speculative-config") + 1])["model"] == draft
    assert base["env"]["HF_HUB_OFFLINE"] == "1" and "VLLM_CACHE_ROOT" in base["env"]
    # The fake accepts 2 of 3 drafted tokens every time: τ = 3, position 3 never accepted.
    assert summary["acceptance_length"] == report["acceptance_length"] == pytest.approx(3.0)
    assert report["accept_rate_by_position"] == [1.0, 1.0, 0.0]
    assert report["lossless"] is True and report["backend"] == "vllm"
    # 10 tokens = the prefill's + 3 verifications of 3 (the last one cut at max_tokens): 3 drafts per prompt.
    assert [p["counts"]["verifications"] for p in report["prompts"]] == [3, 3, 3]
    assert report["tokens_per_s_spec"] > 0 and report["tokens_per_s_base"] > 0
    assert set(report["server"]["start_s"]) == {"baseline", "eagle3"}
    assert not any(alive(p) for p in _pids(fake_vllm)), "a server or its child outlived the stage"


def test_vllm_reports_the_baseline_answer_tokens_outside_the_exported_vocab(fake_vllm, tmp_path, tiny_llama_dir,
                                                                           make_draft, prompts):
    import numpy as np
    from safetensors.numpy import load_file

    from eagle3.target import vocab_size

    from safetensors.numpy import save_file

    draft = make_draft(tiny_llama_dir, tmp_path / "draft", vd=500)
    # the fake answers with runs of consecutive ids: a vocab of the odd ids holds about half of each answer
    tensors = load_file(str(Path(draft) / "model.safetensors"))
    odd = np.arange(1, 1000, 2)
    tensors["d2t"] = odd - np.arange(500)
    tensors["t2d"] = np.zeros(vocab_size(tiny_llama_dir), dtype=bool)
    tensors["t2d"][odd] = True
    save_file(tensors, str(Path(draft) / "model.safetensors"))
    evaluate(_cfg(tmp_path, tiny_llama_dir, draft, prompts))
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    # the fake is lossless (spec output = baseline output); the oracle is the export's t2d mask
    assert report["lossless"] is True
    t2d = load_file(str(Path(draft) / "model.safetensors"))["t2d"]
    answers = [p["token_ids"] for p in report["prompts"]]
    reach = report["sets"][report["primary_set"]]["vocab_reach"]
    assert reach["tokens"] == sum(map(len, answers)) > 0
    assert 0 < reach["outside"] == sum(not t2d[t] for a in answers for t in a) < reach["tokens"]


def test_a_lossy_engine_fails_the_gate_naming_the_prompt(fake_vllm, monkeypatch, tmp_path, tiny_llama_dir,
                                                         make_draft, prompts):
    monkeypatch.setenv("FAKE_VLLM_LOSSY", "1")
    draft = make_draft(tiny_llama_dir, tmp_path / "draft")
    with pytest.raises(GateFailed, match=r"(?s)vllm: speculative output differs from the baseline on 3 prompt.*"
                                         r"prompts.jsonl:1: first difference at generated position 2"):
        evaluate(_cfg(tmp_path, tiny_llama_dir, draft, prompts))
    report = json.loads((tmp_path / "eval" / "report.json").read_text())  # written before the gate
    assert report["lossless"] is False
    assert not any(alive(p) for p in _pids(fake_vllm))


def _full_vocab_draft_with_d2t(tmp_path, tiny_llama_dir, make_draft) -> Path:
    """What the old export wrote for a full-vocab draft: config.json with draft_vocab_size == vocab_size
    and a d2t tensor (written by hand: the export no longer writes one)."""
    from eagle3.target import vocab_size

    draft = Path(make_draft(tiny_llama_dir, tmp_path / "draft"))
    cfg = json.loads((draft / "config.json").read_text())
    cfg["draft_vocab_size"] = cfg["vocab_size"] = vocab_size(tiny_llama_dir)
    (draft / "config.json").write_text(json.dumps(cfg))
    header = json.dumps({"d2t": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    return draft


def test_a_draft_vllm_cannot_load_is_named_with_its_file_and_key(fake_vllm, tmp_path, tiny_llama_dir,
                                                                  make_draft, prompts):
    draft = _full_vocab_draft_with_d2t(tmp_path, tiny_llama_dir, make_draft)
    with pytest.raises(ServerFailed) as e:
        evaluate(_cfg(tmp_path, tiny_llama_dir, str(draft), prompts))
    msg = str(e.value)
    assert "vLLM said: ValueError: There is no module or parameter named 'draft_id_to_target_id'" in msg
    assert f"draft file {draft / 'model.safetensors'}, tensor 'd2t'" in msg and "full-vocab" in msg
    assert not (tmp_path / "eval" / "report.json").exists()
    assert not any(alive(p) for p in _pids(fake_vllm))


def test_draft_blame_names_config_keys_and_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"draft_vocab_size": 8, "eagle_config": {}}))
    assert draft_blame(str(tmp_path), "KeyError: 'draft_vocab_size'") == \
        f"draft file {tmp_path / 'config.json'}, key 'draft_vocab_size'"
    assert "tensor 'midlayer.self_attn.qkv_proj.weight'" in draft_blame(
        str(tmp_path), "There is no module or parameter named 'model.layers.0.self_attn.qkv_proj.weight'")
    assert draft_blame(str(tmp_path), "Error while deserializing header") == \
        f"draft file {tmp_path / 'model.safetensors'}"


def test_stop_from_another_thread_while_starting_leaves_no_server(fake_vllm, monkeypatch, tmp_path,
                                                                  tiny_llama_dir, make_draft, prompts):
    monkeypatch.setenv("FAKE_VLLM_STARTUP_S", "60")
    bench = VLLMBenchmark(_cfg(tmp_path, tiny_llama_dir, make_draft(tiny_llama_dir, tmp_path / "draft"), prompts),
                          health_timeout_s=60)
    errors: list[BaseException] = []

    def run():
        try:
            bench.measure()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 30
    while len(_pids(fake_vllm)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    bench.stop()  # what on_kill reaches through the CLI's SIGTERM handler
    t.join(timeout=40)
    assert not t.is_alive() and errors and "stopped" in str(errors[0])
    assert len(_starts(fake_vllm)) == 1  # no speculative phase after the stop
    assert not any(alive(p) for p in _pids(fake_vllm))


def test_regenerate_serves_through_a_vllm_it_starts_and_stops(fake_vllm, tmp_path, tiny_llama_dir):
    import yaml

    from eagle3.regenerate import RegenerateConfig, regenerate

    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]})
                                                 + "\n" for i in range(3)))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"datasets": [{"name": "chat", "source": str(tmp_path / "chat.jsonl"),
                                                                   "format": "messages", "regenerate": True}]}))
    out = regenerate(RegenerateConfig(manifest=str(tmp_path / "m.yaml"), out=str(tmp_path / "out"), server="vllm",
                                      model=tiny_llama_dir, precision="float32", max_tokens=8, concurrency=2))
    (start,) = _starts(fake_vllm)
    argv = start["argv"]
    # The model is served under the name the openai path sends, in the stage's resolved precision.
    assert argv[argv.index("--served-model-name") + 1] == tiny_llama_dir
    assert argv[argv.index("--dtype") + 1] == "float32" and "--speculative-config" not in argv
    assert out["datasets"]["chat"]["done"] == 3 and out["datasets"]["chat"]["completion_tokens"] == 24
    assert not any(alive(p) for p in _pids(fake_vllm))
    # Re-run with every conversation done: the server starts only at the first request, so none starts.
    again = regenerate(RegenerateConfig(manifest=str(tmp_path / "m.yaml"), out=str(tmp_path / "out"), server="vllm",
                                        model=tiny_llama_dir, precision="float32", max_tokens=8, concurrency=2))
    assert len(_starts(fake_vllm)) == 1
    assert again["datasets"]["chat"]["resumed"] == 3 and again["datasets"]["chat"]["this_run"]["requests"] == 0
    # One new conversation: the server starts once, for it alone.
    with open(tmp_path / "chat.jsonl", "a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "q3"}]}) + "\n")
    more = regenerate(RegenerateConfig(manifest=str(tmp_path / "m.yaml"), out=str(tmp_path / "out"), server="vllm",
                                       model=tiny_llama_dir, precision="float32", max_tokens=8, concurrency=2))
    assert len(_starts(fake_vllm)) == 2 and more["datasets"]["chat"]["this_run"]["requests"] == 1
    assert more["datasets"]["chat"]["done"] == 4 and not any(alive(p) for p in _pids(fake_vllm))


def test_regenerate_on_a_vllm_that_dies_at_start_fails_once_naming_why(fake_vllm, monkeypatch, tmp_path,
                                                                      tiny_llama_dir):
    """Four workers wait for one server: when it cannot start, the stage fails with vLLM's words, and no
    worker starts another."""
    import yaml

    from eagle3.regenerate import RegenerateConfig, regenerate

    monkeypatch.setenv("FAKE_VLLM_CRASH", "ValueError: unsupported architecture FooForCausalLM")
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]})
                                                 + "\n" for i in range(6)))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"datasets": [{"name": "chat", "source": str(tmp_path / "chat.jsonl"),
                                                                   "format": "messages", "regenerate": True}]}))
    with pytest.raises(Exception, match="FooForCausalLM"):
        regenerate(RegenerateConfig(manifest=str(tmp_path / "m.yaml"), out=str(tmp_path / "out"), server="vllm",
                                    model=tiny_llama_dir, precision="float32", max_tokens=8, concurrency=4))
    assert len(_starts(fake_vllm)) == 1
    assert not any(alive(p) for p in _pids(fake_vllm))


def test_compare_with_vllm_sets_both_engines_side_by_side_on_the_headline_set(fake_vllm, tmp_path, tiny_llama_dir,
                                                                              make_draft, prompts):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "Name a colour."}) + "\n")
    draft = make_draft(tiny_llama_dir, tmp_path / "draft")
    cfg = EvaluateConfig(model=tiny_llama_dir, draft=draft, out=str(tmp_path / "eval"), prompts=f"{prompts},{other}",
                         max_new_tokens=10, steps=3, precision="float32", device="cpu", compare_with=("vllm",))
    summary = evaluate(cfg)
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    vllm = json.loads((tmp_path / "eval" / "vllm_report.json").read_text())
    assert report["backend"] == "transformers" and report["engine_order"] == ["transformers", "vllm"]
    assert {p["set"] for p in vllm["prompts"]} == {prompts}  # vLLM decodes the headline set only
    assert {p["set"] for p in report["prompts"]} == {prompts, str(other)}
    # A random draft on the decoder (τ ≈ 1) against the fake's τ = 3: far more than 3 prompts allow.
    assert summary["engines"]["vllm"]["tau"] == pytest.approx(3.0)
    assert summary["engines"]["transformers"]["tau"] < 2.0
    assert summary["agreement"]["vllm"]["agree"] is False and summary["lossless"] is True
    assert summary["engines"]["vllm"]["tau_interval"] == [3.0, 3.0]
