"""A tiny OpenAI-compatible HTTP server for tests, run as a real subprocess on 127.0.0.1.

    python fake_openai_server.py --port P [--fail-first N --fail-status 429] [--delay S]
                                 [--log FILE] [--reasoning] [--upstream URL] [--health-status 200]
                                 [--length-for TEXT]

/v1/chat/completions answers deterministically: "answer <k> to: <last user text>"
(k = the number of assistant turns already in the context, so a test can see
turn-by-turn replay). usage: prompt_tokens = words in all messages,
completion_tokens = words in the answer. With --upstream the request is
forwarded to a real server instead (after the injected failures). The first N
chat requests fail with --fail-status. An answer to a user text containing a
--length-for TEXT reports finish_reason "length" (stopped at max_tokens).
Every answered request is appended to --log as JSON: messages, usage, status.
/health answers --health-status.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--fail-status", type=int, default=503)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--log")
    p.add_argument("--reasoning", action="store_true")
    p.add_argument("--upstream")
    p.add_argument("--health-status", type=int, default=200)
    p.add_argument("--length-for", action="append", default=[])
    args = p.parse_args(argv)
    serve(args)


def serve(args) -> None:
    lock = threading.Lock()
    state = {"chat_requests": 0}

    def log_line(obj) -> None:
        if args.log:
            with lock, open(args.log, "a") as f:
                f.write(json.dumps(obj) + "\n")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # keep test output quiet
            pass

        def _send(self, status: int, obj, headers=None) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(args.health_status, {"ok": args.health_status == 200})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if not self.path.endswith("/chat/completions"):
                return self._send(404, {"error": "not found"})
            with lock:
                state["chat_requests"] += 1
                n = state["chat_requests"]
            if n <= args.fail_first:
                log_line({"status": args.fail_status, "n": n})
                return self._send(args.fail_status, {"error": {"message": f"injected failure {n}"}},
                                  {"Retry-After": "0"} if args.fail_status == 429 else None)
            time.sleep(args.delay)
            if args.upstream:
                req = urllib.request.Request(args.upstream.rstrip("/") + "/v1/chat/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as r:
                    data = json.loads(r.read())
            else:
                data = answer(body, args.reasoning, args.length_for)
            log_line({"status": 200, "n": n, "messages": body["messages"], "usage": data["usage"],
                      "auth": self.headers.get("Authorization"), "sampling": {
                          k: body.get(k) for k in ("temperature", "top_p", "max_tokens", "seed")}})
            self._send(200, data)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"fake server on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


def answer(body: dict, reasoning: bool, length_for: list[str] = ()) -> dict:
    msgs = body["messages"]
    k = sum(m["role"] == "assistant" for m in msgs)
    last_user = next(m["content"] for m in reversed(msgs) if m["role"] == "user")
    text = f"answer {k} to: {last_user}"
    prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in msgs)
    message = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = f"thinking about {last_user}"
    return {"id": "x", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "length" if any(t in last_user for t in length_for) else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text.split()),
                      "total_tokens": prompt_tokens + len(text.split())}}


if __name__ == "__main__":
    main(sys.argv[1:])
