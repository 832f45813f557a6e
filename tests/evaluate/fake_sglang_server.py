"""A stand-in for `python -m sglang.launch_server`, speaking SGLang's documented HTTP API.

Run as a module (the tests put this folder on PYTHONPATH). It accepts only the
flags eagle3 passes, with SGLang's names and types (server_args.py), so a misspelt
flag fails like the real server would. Behaviour knobs (environment):

    FAKE_SGLANG_ARGV_LOG   append this process's argv (JSON) and pid to that file
    FAKE_SGLANG_ACCEPT     tokens per verification the fake speculation reaches (default 2.5)
    FAKE_SGLANG_FAIL       "generate": /generate answers 500; "start": exit 1 before serving
    FAKE_SGLANG_STARTUP_S  seconds before /health answers 200
    FAKE_SGLANG_CHILD      start a child process (like SGLang's scheduler) that must die with us
    FAKE_SGLANG_DIE_AFTER  after this many /generate answers, print a CUDA error line and exit 1

With ``--enable-return-hidden-states`` it loads ``--model-path`` with transformers (in ``--dtype``) and
answers ``return_hidden_states`` / ``return_logprob`` requests with REAL numbers, computed the way SGLang
defines them (fake_sglang_states.py): served as the target of an EAGLE-3 draft it captures the input of
layer id+1 for each ``eagle_config.eagle_aux_hidden_state_layer_ids`` id (llama.py
set_eagle3_layers_to_capture), else the final-norm state; ``input_top_logprobs`` is null for the first
token and then holds, at entry t, the top-k of the distribution position t-1 predicts (log-softmax of fp32
logits over the full vocab); the last position's is ``output_top_logprobs[0]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser(allow_abbrev=False)
parser.add_argument("--model-path", required=True)
parser.add_argument("--tp-size", type=int, default=1)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=30000)
parser.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3"])
parser.add_argument("--speculative-draft-model-path")
parser.add_argument("--speculative-num-steps", type=int)
parser.add_argument("--speculative-eagle-topk", type=int)
parser.add_argument("--speculative-num-draft-tokens", type=int)
parser.add_argument("--mem-fraction-static", type=float)
parser.add_argument("--enable-return-hidden-states", action="store_true")
parser.add_argument("--disable-radix-cache", action="store_true")
parser.add_argument("--chunked-prefill-size", type=int)
parser.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"], default="auto")
parser.add_argument("--quantization")
parser.add_argument("--dp-size", type=int, default=1)
parser.add_argument("--enable-fp32-lm-head", action="store_true")
args = parser.parse_args()

if os.environ.get("FAKE_SGLANG_ARGV_LOG"):
    with open(os.environ["FAKE_SGLANG_ARGV_LOG"], "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(),
                            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\n")
if os.environ.get("FAKE_SGLANG_FAIL") == "start":
    print("RuntimeError: fake sglang: failing at start as asked", flush=True)  # a traceback's last line
    sys.exit(1)
if os.environ.get("FAKE_SGLANG_CHILD"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["FAKE_SGLANG_CHILD"], "a") as f:
        f.write(f"{child.pid}\n")

SPECULATIVE = args.speculative_algorithm is not None
TARGET = None
if args.enable_return_hidden_states:  # the real model, loaded before /health answers (fake_sglang_states.py)
    import fake_sglang_states

    TARGET = fake_sglang_states.Target(args)
DIE_AFTER = int(os.environ.get("FAKE_SGLANG_DIE_AFTER", "0") or 0)
ACCEPT = float(os.environ.get("FAKE_SGLANG_ACCEPT", "2.5"))
READY_AT = time.monotonic() + float(os.environ.get("FAKE_SGLANG_STARTUP_S", "0"))
totals = {"tokens": 0, "verify": 0, "generate": 0}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):  # keep the test log short
        pass

    def do_GET(self):
        if self.path == "/health":
            self._send(200 if time.monotonic() >= READY_AT else 503, {})
        elif self.path in ("/get_server_info", "/server_info"):
            state = {"last_gen_throughput": 100.0}
            if SPECULATIVE:
                with lock:
                    state["avg_spec_accept_length"] = totals["tokens"] / max(totals["verify"], 1)
            self._send(200, {"model_path": args.model_path, "speculative_algorithm": args.speculative_algorithm,
                             "internal_states": [state]})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        if self.path == "/v1/chat/completions":  # the OpenAI-compatible API regeneration uses
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            last = req["messages"][-1]["content"]
            answer = f"fake answer to: {last}"
            return self._send(200, {"id": "c", "object": "chat.completion", "model": req.get("model"),
                                    "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant", "content": answer}}],
                                    "usage": {"prompt_tokens": len(last.split()),
                                              "completion_tokens": len(answer.split())}})
        if self.path != "/generate":
            return self._send(404, {"detail": "Not Found"})
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if os.environ.get("FAKE_SGLANG_FAIL") == "generate":
            return self._send(500, {"error": {"message": "fake failure"}})
        ids, params = req.get("input_ids"), req.get("sampling_params") or {}
        if not isinstance(ids, list) or params.get("temperature") != 0:
            return self._send(400, {"error": {"message": "want input_ids and temperature 0"}})
        with lock:
            totals["generate"] += 1
            if DIE_AFTER and totals["generate"] > DIE_AFTER:  # like a scheduler crash: the server exits
                print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (fake)", flush=True)
                os._exit(1)
        if req.get("return_hidden_states") and TARGET is None:  # tokenizer_manager refuses it
            return self._send(400, {"error": {"message": "The server is not configured to return the hidden "
                                                         "states. Please set `--enable-return-hidden-states`."}})
        if TARGET is not None and (req.get("return_hidden_states") or req.get("return_logprob")):
            return self._send(200, TARGET.generate(req))
        n = int(params.get("max_new_tokens", 16))
        meta = {"id": "x", "prompt_tokens": len(ids), "completion_tokens": n, "cached_tokens": 0,
                "e2e_latency": 0.01, "finish_reason": {"type": "length", "length": n}}
        if SPECULATIVE:
            meta["spec_verify_ct"] = math.ceil(n / ACCEPT)
            with lock:
                totals["tokens"] += n
                totals["verify"] += meta["spec_verify_ct"]
        time.sleep(0.002 * (meta.get("spec_verify_ct") or n))  # speculation: fewer forwards, faster
        self._send(200, {"text": f"out-{sum(ids) % 97}", "output_ids": list(range(n)), "meta_info": meta})


ThreadingHTTPServer.request_queue_size = 1024  # a real server's backlog: extraction sends many requests at once
ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
