"""The openai backend against a REAL OpenAI-compatible server: llama-cpp-python's server serving the
bundled SmolLM2 GGUF on 127.0.0.1. Skipped (with the reason) when llama-cpp-python[server] is absent.

A recording proxy (fake_openai_server.py --upstream) sits in front of it where a test needs the
server's own usage numbers: it forwards each request and logs the usage the server answered with.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from regen_helpers import conversations, free_port, read_jsonl, wait_http, write_dataset

from eagle3.regenerate import RegenerateConfig, regenerate

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp", reason="needs llama-cpp-python[server] (pip install 'llama-cpp-python[server]')")
pytest.importorskip("sse_starlette", reason="needs the [server] extra of llama-cpp-python")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LlamaServer:
    def __init__(self, log_path, port: int | None = None):
        from eagle3.target import _smollm2_gguf

        self.gguf, self.port, self.log_path = str(_smollm2_gguf()), port or free_port(), log_path
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LlamaServer":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", self.gguf, "--host", "127.0.0.1",
                 "--port", str(self.port), "--n_ctx", "2048", "--n_threads", "2"],
                stdout=log, stderr=subprocess.STDOUT)
        wait_http(self.url + "/v1/models", timeout=180, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    server = LlamaServer(tmp_path_factory.mktemp("llama") / "server.log").start()
    yield server
    server.stop()


def cfg(manifest, out, url, **kw):
    base = dict(manifest=str(manifest), out=str(out), backend="openai", model="smollm2", base_url=url,
                concurrency=2, max_tokens=24, backoff_s=0.2)
    return RegenerateConfig(**{**base, **kw})


def test_real_multi_turn_replay_and_accounting(tmp_path, llama, fake_server):
    proxy = fake_server("--upstream", llama.url)
    manifest = write_dataset(tmp_path, conversations(3, turns=2))
    stats = regenerate(cfg(manifest, tmp_path / "out", proxy.url))["datasets"]["chat"]
    recs = read_jsonl(tmp_path / "out/chat/regenerated.jsonl")
    assert stats["done"] == 3 and stats["failed"] == 0
    for r in recs:
        answers = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        assert len(answers) == 2 and all(a.strip() for a in answers)
        assert not any(a.startswith("original answer") for a in answers)
        t0, t1 = r["regeneration"]["turns"]
        # Turn 2's prompt contains turn 1's question and the target's answer to it.
        assert t1["prompt_tokens"] > t0["prompt_tokens"] + t0["completion_tokens"]
    # The second request of each conversation carried the regenerated first answer.
    seconds = [e for e in proxy.entries() if len(e["messages"]) == 4]
    firsts = {r["messages"][1]["content"]: r["messages"][2]["content"] for r in recs}
    assert len(seconds) == 3 and all(e["messages"][2]["content"] == firsts[e["messages"][1]["content"]]
                                     for e in seconds)
    usage = [e["usage"] for e in proxy.entries()]
    assert stats["requests"] == len(usage) == 6
    assert stats["prompt_tokens"] == sum(u["prompt_tokens"] for u in usage)
    assert stats["completion_tokens"] == sum(u["completion_tokens"] for u in usage)


def test_kill_and_resume(tmp_path, llama):
    manifest = write_dataset(tmp_path, conversations(8, turns=1))
    out = tmp_path / "out"
    records = out / "chat" / "regenerated.jsonl"
    cmd = [sys.executable, "-m", "eagle3.cli", "regenerate", "--manifest", str(manifest), "--out", str(out),
           "--backend", "openai", "--base-url", llama.url, "--model", "smollm2", "--concurrency", "1",
           "--max-tokens", "24"]
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (records.exists() and records.read_bytes().count(b"\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "run ended or stalled before the kill"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    done_before = records.read_bytes().count(b"\n")
    assert done_before < 8
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    stats = json.loads((out / "chat" / "stats.json").read_text())
    assert stats["done"] == 8 and stats["resumed"] >= done_before and stats["this_run"]["requests"] <= 8 - done_before
    assert sorted(r["source"]["line"] for r in read_jsonl(records)) == list(range(1, 9))


def test_server_stopped_mid_run_then_restarted(tmp_path):
    server = LlamaServer(tmp_path / "server.log").start()
    try:
        manifest = write_dataset(tmp_path, conversations(6, turns=1))
        out = tmp_path / "out"
        records = out / "chat" / "regenerated.jsonl"
        cmd = [sys.executable, "-m", "eagle3.cli", "regenerate", "--manifest", str(manifest), "--out", str(out),
               "--backend", "openai", "--base-url", server.url, "--model", "smollm2", "--concurrency", "1",
               "--max-tokens", "24", "--max-retries", "12"]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": REPO}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while not (records.exists() and records.read_bytes().count(b"\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        server.stop()  # the real server goes away mid-run ...
        time.sleep(3)
        server.start()  # ... and comes back on the same port
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-2000:]
        stats = json.loads((out / "chat" / "stats.json").read_text())
        assert stats["done"] == 6 and stats["failed"] == 0
        assert stats["this_run"]["retries"] >= 1 and "connection error" in stderr
    finally:
        server.stop()
