"""Benchmark a draft on SGLang: a baseline server, then an EAGLE3 server.

Each phase launches ``python -m sglang.launch_server`` through
`eagle3.serving.sglang.SGLangServer` (on the leased GPUs), waits for
``GET /health``, sends every prompt to ``POST /generate`` and reads
``GET /get_server_info``, then stops the server in ``finally``.

Request and response shapes (SGLang docs "SGLang Native APIs" and
``tokenizer_manager.py``):

    POST /generate {"input_ids": [...], "sampling_params": {"temperature": 0, "max_new_tokens": N}}
      -> {"text": ..., "output_ids": [...], "meta_info": {"prompt_tokens", "completion_tokens",
          "e2e_latency", "finish_reason", "spec_verify_ct" (only with speculation, on finish)}}
    GET /get_server_info -> {..., "internal_states": [{"avg_spec_accept_length", "last_gen_throughput", ...}]}

τ = Σ completion_tokens / Σ spec_verify_ct (SGLang's own definition; it counts
the prefill's first token, so it reads a little above the transformers
backend's τ on short outputs). The server's cumulative avg_spec_accept_length
also covers its start-up warm-up request, so the two are compared with a
tolerance. Never run against a live SGLang here (no GPU): tested against
tests/evaluate/fake_sglang_server.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import sys
import tempfile
import time
from typing import Any

from eagle3 import layout, storage
from eagle3.errors import Eagle3Error, GateFailed, InputError
from eagle3.export import draft_is_parallel
from eagle3.serving import ServerPhases, free_port
from eagle3.serving.process import http_request
from eagle3.serving.sglang import default_module

log = logging.getLogger(__name__)


class SGLangResponseError(Eagle3Error):
    """A server answered with an error or with a response missing a documented field."""


@dataclasses.dataclass(frozen=True)
class SGLangBenchConfig:
    target: str
    """Target model path as SGLang loads it (HF dir or hub id); also gives the chat template."""
    draft: str
    """Exported EAGLE3 draft dir (--speculative-draft-model-path)."""
    out: str
    """Output dir for sglang_report.json (local or s3://)."""
    prompts: str = "humaneval"
    """Comma-separated prompt sets: "humaneval", "chat" or prompts JSONL files (see eagle3.evaluate.prompts);
    all are sent, τ is reported over all of them and per set."""
    algorithm: str = "EAGLE3"
    """--speculative-algorithm."""
    num_steps: int = 3
    """--speculative-num-steps: draft chain depth."""
    eagle_topk: int = 1
    """--speculative-eagle-topk: 1 = a chain."""
    num_draft_tokens: int = 4
    """--speculative-num-draft-tokens: steps + 1 for a chain."""
    limit: int | None = None
    """First N prompts only."""
    max_new_tokens: int = 128
    """sampling_params.max_new_tokens (greedy: temperature 0)."""
    concurrency: int = 1
    """Requests in flight at once."""
    tp: int = 1
    """--tp-size."""
    gpus: list[int] | None = None
    """Leased GPU ids -> CUDA_VISIBLE_DEVICES."""
    port: int = 30000
    host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    """More server flags for both phases, e.g. ("--mem-fraction-static", "0.8")."""
    health_timeout_s: float = 1800.0
    request_timeout_s: float = 600.0
    cross_check_tolerance: float = 0.15
    """Largest relative gap between client τ and the server's avg_spec_accept_length counted as agreement."""
    python: str = sys.executable
    module: str = "sglang.launch_server"
    """The server module (tests swap in a fake)."""
    server_env: dict[str, str] | None = None
    """Extra environment for the servers."""

    def __post_init__(self) -> None:
        for name in ("num_steps", "eagle_topk", "num_draft_tokens", "max_new_tokens", "concurrency", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputError(f"SGLangBenchConfig.{name}={value!r} must be an int >= 1")
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise InputError(f"SGLangBenchConfig: with eagle_topk=1 (a chain) num_draft_tokens must be "
                             f"num_steps + 1 = {self.num_steps + 1}, got {self.num_draft_tokens}")


def speculative_args(cfg: SGLangBenchConfig) -> dict:
    """SGLangServer's ``speculative`` dict: every flag explicit."""
    return {"algorithm": cfg.algorithm, "draft_model_path": cfg.draft, "num_steps": cfg.num_steps,
            "eagle_topk": cfg.eagle_topk, "num_draft_tokens": cfg.num_draft_tokens}


def _http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> Any:
    return json.loads(http_request(url, payload, timeout, SGLangResponseError))


def parse_generate(resp: Any, speculative: bool, url: str) -> dict:
    """The fields the benchmark needs from one /generate response."""
    meta = resp.get("meta_info") if isinstance(resp, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("completion_tokens"), int):
        raise SGLangResponseError(f"{url}: response has no meta_info.completion_tokens: {str(resp)[:300]}")
    out = {"completion_tokens": meta["completion_tokens"], "prompt_tokens": meta.get("prompt_tokens"),
           "e2e_latency": meta.get("e2e_latency"), "text": resp.get("text"), "output_ids": resp.get("output_ids"),
           "finish_reason": (meta.get("finish_reason") or {}).get("type")
           if isinstance(meta.get("finish_reason"), dict) else meta.get("finish_reason")}
    if speculative:
        if not isinstance(meta.get("spec_verify_ct"), int):
            raise SGLangResponseError(f"{url}: speculative server returned no meta_info.spec_verify_ct "
                                      f"(is --speculative-algorithm set?): {str(meta)[:300]}")
        out["spec_verify_ct"] = meta["spec_verify_ct"]
    return out


def server_accept_length(info: Any) -> float | None:
    """internal_states[0].avg_spec_accept_length of /get_server_info, or None."""
    states = info.get("internal_states") if isinstance(info, dict) else None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        return float(value) if value is not None else None
    return None


class SGLangBenchmark:
    """Runs the two phases; `stop()` (from an operator's on_kill) stops whatever server runs."""

    def __init__(self, cfg: SGLangBenchConfig):
        if draft_is_parallel(cfg.draft):
            raise InputError("a P-EAGLE (parallel_drafting) draft: SGLang has no parallel drafter (open request "
                             "sgl-project/sglang#23171) and would run it as a chain; evaluate it with --backend "
                             "vllm or transformers", file=storage.join(cfg.draft, "config.json"))
        self.cfg = cfg
        self.phases = ServerPhases()
        self.log_dir = tempfile.mkdtemp(prefix="eagle3-sglang-logs-")

    def stop(self) -> None:
        self.phases.stop()

    def _server_for(self, phase: str):
        from eagle3.serving.sglang import SGLangServer

        cfg = self.cfg
        return SGLangServer(cfg.target, tp=cfg.tp, port=cfg.port, host=cfg.host, extra_args=cfg.extra_args,
                            speculative=speculative_args(cfg) if phase == "eagle3" else None, gpus=cfg.gpus,
                            log_path=f"{self.log_dir}/{phase}.log", env=cfg.server_env, python=cfg.python,
                            module=cfg.module)

    def _send_all(self, url: str, prompts: list[list[int]], speculative: bool) -> tuple[list[dict], float]:
        cfg = self.cfg
        params = {"temperature": 0, "max_new_tokens": cfg.max_new_tokens}

        def one(ids: list[int]) -> dict:
            resp = _http_json(url + "/generate", {"input_ids": ids, "sampling_params": params},
                              timeout=cfg.request_timeout_s)
            return parse_generate(resp, speculative, url + "/generate")

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(cfg.concurrency) as pool:
            results = list(pool.map(one, prompts))
        return results, time.perf_counter() - start

    def run_phase(self, phase: str, prompts: list[list[int]]) -> dict:
        server = self._server_for(phase)

        def measure(server) -> tuple:
            results, seconds = self._send_all(server.url, prompts, speculative=phase == "eagle3")
            return results, seconds, _http_json(server.url + "/get_server_info", timeout=60)

        results, seconds, info = self.phases.run(server, measure, self.cfg.health_timeout_s)
        tokens = sum(r["completion_tokens"] for r in results)
        out = {"command": server.command(), "completion_tokens": tokens, "seconds": seconds,
               "tokens_per_s": tokens / seconds if seconds > 0 else 0.0, "requests": results,
               "server_accept_length": server_accept_length(info)}
        if phase == "eagle3":
            verify = sum(r["spec_verify_ct"] for r in results)
            out["spec_verify_ct"] = verify
            out["acceptance_length"] = tokens / verify if verify else 0.0
        return out

    def run(self) -> dict:
        from eagle3.evaluate.prompts import encode_prompt, load_prompt_sets
        from eagle3.target import load_tokenizer

        cfg = self.cfg
        sets = load_prompt_sets(cfg.prompts, cfg.limit)
        tokenizer = load_tokenizer(cfg.target)
        names = [name for name, ps in sets.items() for _ in ps]
        ids = [encode_prompt(tokenizer, p) for ps in sets.values() for p in ps]
        base = self.run_phase("baseline", ids)
        spec = self.run_phase("eagle3", ids)
        per_set = {}
        for name in sets:
            rows = [r for n, r in zip(names, spec["requests"]) if n == name]
            verify = sum(r["spec_verify_ct"] for r in rows)
            per_set[name] = {"num_prompts": len(rows), "acceptance_length":
                             sum(r["completion_tokens"] for r in rows) / verify if verify else 0.0}
        tau, server_tau = spec["acceptance_length"], spec["server_accept_length"]
        gap = abs(tau - server_tau) / tau if server_tau is not None and tau else None
        agree = gap is not None and gap <= cfg.cross_check_tolerance
        if not agree:
            log.warning("SGLang τ cross-check: client %.3f vs server avg_spec_accept_length %s", tau, server_tau)
        same = sum(a["text"] == b["text"] for a, b in zip(base["requests"], spec["requests"]))
        # Lossless: the speculative token ids equal the baseline's, prompt by prompt (text when ids are absent).
        differ = [i for i, (a, b) in enumerate(zip(base["requests"], spec["requests"]))
                  if (a.get("output_ids"), a["text"]) != (b.get("output_ids"), b["text"])]
        report = {
            "backend": "sglang", "acceptance_length": tau, "server_accept_length": server_tau,
            "cross_check": {"relative_gap": gap, "tolerance": cfg.cross_check_tolerance, "agree": agree},
            "tokens_per_s_spec": spec["tokens_per_s"], "tokens_per_s_base": base["tokens_per_s"],
            "speedup": spec["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else 0.0,
            "identical_outputs": same, "lossless": not differ, "differing_prompts": differ,
            "num_prompts": len(ids), "steps": cfg.num_steps,
            "max_new_tokens": cfg.max_new_tokens, "concurrency": cfg.concurrency,
            "target": cfg.target, "draft": cfg.draft, "prompts_source": cfg.prompts, "sets": per_set,
            "phases": {"baseline": base, "eagle3": spec},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        storage.write_json(storage.join(cfg.out, layout.engine_report("sglang")), report)
        summary = {k: v for k, v in report.items() if k != "phases"}
        storage.write_json(storage.join(cfg.out, layout.EVAL_REPORT), summary)  # what publish and the report read
        if differ:
            raise GateFailed(f"SGLang's speculative output differs from its baseline on {len(differ)} of "
                             f"{len(ids)} prompts (indices {differ[:20]}); see "
                             f"{storage.join(cfg.out, layout.EVAL_REPORT)}")
        return summary


def from_evaluate_config(cfg) -> SGLangBenchConfig:
    """The SGLang benchmark of an evaluate stage config (a chain: num_draft_tokens = steps + 1)."""
    return SGLangBenchConfig(target=cfg.model, draft=cfg.draft, out=cfg.out, prompts=cfg.prompts,
                             num_steps=cfg.steps, num_draft_tokens=cfg.steps + 1, limit=cfg.limit,
                             max_new_tokens=cfg.max_new_tokens, tp=cfg.tp,
                             gpus=list(cfg.gpus) if cfg.gpus else None, port=cfg.port or free_port(),
                             module=default_module())


def sglang_benchmark(cfg: SGLangBenchConfig) -> dict:
    """Run both phases and write ``cfg.out``/sglang_report.json; returns its summary. Without ``cfg.gpus``
    the servers run on ``cfg.tp`` GPUs leased for the call (eagle3.devices)."""
    if cfg.gpus is not None:
        return SGLangBenchmark(cfg).run()
    from eagle3.devices import lease_device

    with lease_device(cfg.tp):  # narrows CUDA_VISIBLE_DEVICES for the block; the servers inherit it
        return SGLangBenchmark(cfg).run()
