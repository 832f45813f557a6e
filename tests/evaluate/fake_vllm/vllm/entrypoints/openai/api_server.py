"""A stand-in for `python -m vllm.entrypoints.openai.api_server` (the tests put tests/evaluate/fake_vllm first
on PYTHONPATH). It accepts only the flags eagle3 passes, under vLLM's names, and speaks the parts of vLLM's
API the project uses: GET /health, POST /v1/completions (token-id prompts, return_token_ids), POST
/v1/chat/completions, GET /metrics with vLLM's spec-decode counter names.

The "target" continues a prompt with (last id + 1 + i) % 1000. With --speculative-config every verification
drafts k tokens and accepts FAKE_VLLM_ACCEPT of them (default 2), so τ = 1 + accepted / drafts is known.
It loads the draft like vLLM does in one respect: a full-vocab draft (draft_vocab_size == vocab_size) whose
model.safetensors holds d2t fails with vLLM's own message. Knobs (environment):

    FAKE_VLLM_RECORD      append {"argv", "pid", "env"} (JSON) to that file
    FAKE_VLLM_CHILD       start a child (like vLLM's engine core) and append its pid to that file
    FAKE_VLLM_STARTUP_S   seconds before /health answers 200
    FAKE_VLLM_LOSSY       with speculation, change the 3rd generated token (a broken engine)
    FAKE_VLLM_CRASH       exit 1 at start with that message (a model vLLM cannot load)
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "auto"], default="auto")
parser.add_argument("--max-model-len", type=int)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8000)
parser.add_argument("--served-model-name")
parser.add_argument("--enforce-eager", action="store_true")
parser.add_argument("--speculative-config")
parser.add_argument("--tensor-parallel-size", type=int, default=1)
args = parser.parse_args()
SPEC = json.loads(args.speculative_config) if args.speculative_config else None

if os.environ.get("FAKE_VLLM_RECORD"):
    with open(os.environ["FAKE_VLLM_RECORD"], "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(),
                            "env": {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "LD_", "HF_"))}})
                + "\n")
if os.environ.get("FAKE_VLLM_CHILD"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["FAKE_VLLM_CHILD"], "a") as f:
        f.write(f"{child.pid}\n")
if os.environ.get("FAKE_VLLM_CRASH"):
    print(f"(EngineCore pid=1) ERROR {os.environ['FAKE_VLLM_CRASH']}", flush=True)
    sys.exit(1)


def _safetensors_names(path: str) -> set[str]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return set(json.loads(f.read(n))) - {"__metadata__"}


if SPEC:
    assert SPEC["method"] == "eagle3", SPEC
    draft = json.load(open(os.path.join(SPEC["model"], "config.json")))
    names = _safetensors_names(os.path.join(SPEC["model"], "model.safetensors"))
    if draft["draft_vocab_size"] == draft["vocab_size"] and "d2t" in names:
        print("(EngineCore pid=1) ERROR Traceback (most recent call last):", flush=True)
        print("(EngineCore pid=1) ValueError: There is no module or parameter named 'draft_id_to_target_id' "
              "in LlamaForCausalLMEagle3", flush=True)
        sys.exit(1)

K = SPEC["num_speculative_tokens"] if SPEC else 0
ACCEPT = int(os.environ.get("FAKE_VLLM_ACCEPT", "2"))
READY_AT = time.monotonic() + float(os.environ.get("FAKE_VLLM_STARTUP_S", "0"))
NAME = args.served_model_name or args.model
counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * K}
lock = threading.Lock()


def generate(prompt: list[int], n: int) -> list[int]:
    out = [(prompt[-1] + 1 + i) % 1000 for i in range(n)]
    if SPEC and os.environ.get("FAKE_VLLM_LOSSY") and n >= 3:
        out[2] = (out[2] + 7) % 1000
    if SPEC:
        made = 1  # the prefill's token is no verification
        with lock:
            while made < n:
                counters["drafts"] += 1
                counters["draft_tokens"] += K
                counters["accepted"] += ACCEPT
                for i in range(ACCEPT):
                    counters["per_pos"][i] += 1
                made += ACCEPT + 1
    return out


def metrics() -> str:
    labels = f'engine="0",model_name="{NAME}"'
    lines = ["# HELP vllm:num_requests_running Number of requests.", f"vllm:num_requests_running{{{labels}}} 0.0"]
    if SPEC:
        for name in ("drafts", "draft_tokens", "accepted"):
            metric = {"drafts": "num_drafts", "draft_tokens": "num_draft_tokens", "accepted": "num_accepted_tokens"}
            lines += [f"# TYPE vllm:spec_decode_{metric[name]}_total counter",
                      f"vllm:spec_decode_{metric[name]}_total{{{labels}}} {float(counters[name])}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {float(c)}'
                  for i, c in enumerate(counters["per_pos"])]
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/health":
            self._send(200 if time.monotonic() >= READY_AT else 503, b"")
        elif self.path == "/metrics":
            self._send(200, metrics().encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"{}")

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if req.get("model") != NAME:
            self._send(404, json.dumps({"error": {"message": f"The model `{req.get('model')}` does not exist."}})
                       .encode())
            return
        if self.path == "/v1/completions":
            prompt = req["prompt"]
            assert isinstance(prompt, list) and all(isinstance(i, int) for i in prompt), "send token ids"
            ids = generate(prompt, int(req["max_tokens"]))
            choice = {"index": 0, "text": " ".join(map(str, ids)), "finish_reason": "length"}
            if req.get("return_token_ids"):
                choice["token_ids"] = ids
            body = {"choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}
        elif self.path == "/v1/chat/completions":
            n = min(int(req.get("max_tokens") or 16), 8)
            text = f"answer to {req['messages'][-1]['content'][:20]}"
            body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": n}}
        else:
            self._send(404, b"{}")
            return
        self._send(200, json.dumps(body).encode())


ThreadingHTTPServer.request_queue_size = 1024  # a real server's backlog: extraction sends many requests at once
ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
