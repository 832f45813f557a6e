"""Which backend regenerates the demo fastest on this machine? hf (fp32, batched) vs llama.cpp's server (Q4 GGUF).

    python -m eagle3.regenerate.bench --manifest demo-data/manifest.yaml --dataset arithmetic \\
        --samples 20 --max-tokens 128 --out /tmp/regen-bench

Runs the same conversations through each backend (``--restart``, greedy, same
max_tokens) and prints completion tokens/s, wall time (model load included and
excluded), the CPU seconds spent (client + server) and the load average, as a Markdown table. The llama.cpp server
(``python -m llama_cpp.server``, from ``pip install 'llama-cpp-python[server]'``)
is started here on 127.0.0.1 and stopped afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request

import yaml

from eagle3 import storage
from eagle3.regenerate.stage import RegenerateConfig, regenerate


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _llama_server(threads: int):
    from eagle3.target import _smollm2_gguf

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(_smollm2_gguf()),
                             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
                             "--n_threads", str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("llama_cpp.server exited; is llama-cpp-python[server] installed?")
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("llama_cpp.server did not start in 300 s")


def _subset_manifest(manifest: str, dataset: str, samples: int, out: str) -> str:
    from eagle3.tokenize.manifest import load_manifest

    spec = next(s for s in load_manifest(manifest) if s.name == dataset)
    entry = {"name": dataset, "source": spec.source, "format": spec.format, "max_samples": samples,
             "regenerate": True}
    path = os.path.join(out, "bench-manifest.yaml")
    storage.write_text(path, yaml.safe_dump({"datasets": [entry]}))
    return path


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(name: str, cfg: RegenerateConfig, server_pid: int | None = None) -> dict:
    # On a shared, oversubscribed CPU wall time mostly measures the neighbours, so CPU seconds
    # (this process plus the server's) are reported too: tokens per CPU-second compares backends.
    start, cpu0 = time.monotonic(), _cpu_s(os.getpid()) + (_cpu_s(server_pid) if server_pid else 0.0)
    stats = regenerate(cfg)["datasets"][cfg.datasets[0]]
    total = time.monotonic() - start
    cpu = _cpu_s(os.getpid()) + (_cpu_s(server_pid) if server_pid else 0.0) - cpu0
    run = stats["this_run"]
    return {"backend": name, "conversations": stats["done"], "requests": run["requests"],
            "prompt_tokens": run["prompt_tokens"], "completion_tokens": run["completion_tokens"],
            "generate_wall_s": run["wall_s"], "total_wall_s": round(total, 1), "cpu_s": round(cpu, 1),
            "tok_per_wall_s": round(run["completion_tokens"] / run["wall_s"], 1),
            "tok_per_cpu_s": round(run["completion_tokens"] / cpu, 1),
            "load_avg_1m": round(os.getloadavg()[0], 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default="/tmp/regen-bench")
    p.add_argument("--hf-batch", type=int, default=20)
    p.add_argument("--llama-concurrency", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads (torch uses its own default)")
    p.add_argument("--skip", action="append", default=[], choices=("hf", "llama.cpp"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    manifest = _subset_manifest(args.manifest, args.dataset, args.samples, args.out)
    common = dict(manifest=manifest, datasets=(args.dataset,), max_tokens=args.max_tokens, restart=True)
    rows = []
    if "hf" not in args.skip:
        rows.append(_run(f"hf fp32 CPU, batch {args.hf_batch}", RegenerateConfig(
            out=os.path.join(args.out, "hf"), backend="hf", concurrency=args.hf_batch, **common)))
    if "llama.cpp" not in args.skip:
        proc, url = _llama_server(args.threads)
        try:
            rows.append(_run(f"llama.cpp server Q4_1, {args.llama_concurrency} in flight", RegenerateConfig(
                out=os.path.join(args.out, "llama"), backend="openai", model="smollm2", base_url=url,
                concurrency=args.llama_concurrency, **common), server_pid=proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
