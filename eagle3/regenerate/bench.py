"""Which backend regenerates the demo fastest on this machine? hf (fp32, batched) vs a vLLM server (fp32).

    python -m eagle3.regenerate.bench --manifest demo-data/manifest.yaml --dataset arithmetic \\
        --samples 20 --max-tokens 128 --out /tmp/regen-bench

Runs the same conversations through each backend (``--restart``, greedy, same
max_tokens) and prints completion tokens/s, wall time (model load and server start included
and excluded), the CPU seconds spent by this process and its children (the vLLM server) and
the load average, as a Markdown table. The vLLM server is the stage's own
(``RegenerateConfig.server="vllm"``: started on 127.0.0.1 for the run and stopped after it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time

import yaml

from eagle3 import storage
from eagle3.regenerate import RegenerateConfig, regenerate


def _subset_manifest(manifest: str, dataset: str, samples: int, out: str) -> str:
    from eagle3.datasets.manifest import load_manifest

    spec = next(s for s in load_manifest(manifest) if s.name == dataset)
    entry = {"name": dataset, "source": spec.source, "format": spec.format, "max_samples": samples,
             "regenerate": True}
    path = os.path.join(out, "bench-manifest.yaml")
    storage.write_text(path, yaml.safe_dump({"datasets": [entry]}))
    return path


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its waited-for children (a stopped server)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _run(name: str, cfg: RegenerateConfig) -> dict:
    # On a shared, oversubscribed CPU wall time mostly measures the neighbours, so CPU seconds
    # (this process plus the server's) are reported too: tokens per CPU-second compares backends.
    start, cpu0 = time.monotonic(), _cpu_s()
    stats = regenerate(cfg)["datasets"][cfg.datasets[0]]
    total = time.monotonic() - start
    cpu = _cpu_s() - cpu0
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
    p.add_argument("--vllm-concurrency", type=int, default=16)
    p.add_argument("--skip", action="append", default=[], choices=("hf", "vllm"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    manifest = _subset_manifest(args.manifest, args.dataset, args.samples, args.out)
    common = dict(manifest=manifest, datasets=(args.dataset,), max_tokens=args.max_tokens, restart=True)
    rows = []
    if "hf" not in args.skip:
        rows.append(_run(f"hf fp32 CPU, batch {args.hf_batch}", RegenerateConfig(
            out=os.path.join(args.out, "hf"), backend="hf", concurrency=args.hf_batch, **common)))
    if "vllm" not in args.skip:
        rows.append(_run(f"vLLM server fp32, {args.vllm_concurrency} in flight (start included)", RegenerateConfig(
            out=os.path.join(args.out, "vllm"), backend="openai", server="vllm", precision="float32",
            concurrency=args.vllm_concurrency, **common)))
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
