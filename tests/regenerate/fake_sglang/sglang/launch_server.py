"""Fake `python -m sglang.launch_server`: parses SGLang's flags, records them, serves /health.

Like the real server it starts a worker subprocess (here: `sleep`), so a test
can check that stopping the server leaves no process behind. Environment:
FAKE_SGLANG_RECORD (JSON file for argv, env and pids), FAKE_SGLANG_HEALTH
(status of /health, default 200). --model-path EXIT makes it exit at once.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fake_openai_server  # noqa: E402

p = argparse.ArgumentParser(allow_abbrev=False)
p.add_argument("--model-path", required=True)
p.add_argument("--tp-size", type=int, default=1)
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, default=30000)
for flag in ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
             "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--mem-fraction-static"):
    p.add_argument(flag)
args = p.parse_args()
if args.model_path == "EXIT":
    print("fake sglang: cannot load model EXIT", flush=True)
    sys.exit(3)
worker = subprocess.Popen(["sleep", "600"])
record = os.environ.get("FAKE_SGLANG_RECORD")
if record:
    with open(record, "w") as f:
        json.dump({"argv": sys.argv[1:], "args": vars(args), "pid": os.getpid(), "worker_pid": worker.pid,
                   "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
fake_openai_server.main(["--port", str(args.port), "--health-status", os.environ.get("FAKE_SGLANG_HEALTH", "200")])
