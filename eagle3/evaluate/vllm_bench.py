"""The evaluate stage on vLLM: a baseline server, then an EAGLE-3 server with the draft, same prompts, greedy.

Each phase starts `eagle3.serving.vllm.VLLMServer` on 127.0.0.1, waits for ``/health``
and sends the prompts one at a time as token ids:

    POST /v1/completions {"model", "prompt": [ids], "max_tokens": N, "temperature": 0, "return_token_ids": true}
      -> {"choices": [{"text", "token_ids", "finish_reason"}], "usage": {"completion_tokens", ...}}

so the lossless check compares the two phases' token ids, prompt by prompt. Acceptance comes from
vLLM's own spec-decode counters on ``GET /metrics`` (v1/spec_decode/metrics.py), read before and
after every prompt; one prompt's deltas reduce to the per-prompt record of eagle3.acceptance
(drafts = verifications, emitted = drafts + accepted, accepted at 0-based position i = drafts that
accepted more than i tokens), so τ, the per-position rates and their bootstrap intervals are
computed exactly as for the project decoder. τ = 1 + accepted / drafts, vLLM's own definition.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from typing import Any

from eagle3 import acceptance, storage
from eagle3.errors import Eagle3Error, InputError
from eagle3.evaluate import lossless
from eagle3.evaluate.config import EvaluateConfig
from eagle3.serving import ServerPhases, free_port
from eagle3.serving.process import http_request

log = logging.getLogger(__name__)

COUNTERS = {"drafts": "vllm:spec_decode_num_drafts_total", "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r"^([\w:]+)(?:\{([^}]*)\})?\s+([-+0-9.eEinfaN]+)")


class VLLMResponseError(Eagle3Error):
    """vLLM answered with an error or without a documented field."""


def parse_metrics(text: str) -> dict:
    """The spec-decode counters of a Prometheus /metrics page, summed over engines; zeros when absent."""
    out: dict[str, Any] = {name: 0.0 for name in COUNTERS}
    out["per_position"] = {}
    by_metric = {v: k for k, v in COUNTERS.items()}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        metric, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if metric in by_metric:
            out[by_metric[metric]] += value
        elif metric == PER_POSITION:
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                out["per_position"][int(pos.group(1))] = out["per_position"].get(int(pos.group(1)), 0.0) + value
    return out


def counts_between(before: dict, after: dict, k: int) -> dict:
    """One prompt's eagle3.acceptance record from two /metrics readings around it."""
    drafts = round(after["drafts"] - before["drafts"])
    per_pos = [round(after["per_position"].get(i, 0.0) - before["per_position"].get(i, 0.0)) for i in range(k)]
    accepted = round(after["accepted"] - before["accepted"])
    return {"verifications": drafts, "emitted": drafts + accepted, "reached": [drafts, *per_pos[:-1]],
            "accepted": per_pos}


def _http(url: str, payload: dict | None = None, timeout: float = 600.0) -> bytes:
    return http_request(url, payload, timeout, VLLMResponseError)


def complete(url: str, model: str, ids: list[int], max_tokens: int, timeout: float = 600.0) -> dict:
    """One greedy completion of prompt token ids; its generated token ids, text and finish reason."""
    body = json.loads(_http(url + "/v1/completions", {"model": model, "prompt": ids, "max_tokens": max_tokens,
                                                       "temperature": 0, "return_token_ids": True}, timeout))
    choice = (body.get("choices") or [None])[0] if isinstance(body, dict) else None
    if not isinstance(choice, dict) or not isinstance(choice.get("token_ids"), list):
        raise VLLMResponseError(f"{url}/v1/completions: no choices[0].token_ids in the answer (is this vLLM >= "
                                f"0.10, which knows return_token_ids?): {str(body)[:300]}")
    return {"token_ids": [int(t) for t in choice["token_ids"]], "text": choice.get("text") or "",
            "finish_reason": choice.get("finish_reason")}


def _stable_metrics(url: str, settle_s: float = 0.05, tries: int = 20) -> dict:
    """/metrics once two readings agree (the counters are recorded just after the answer is sent)."""
    last = parse_metrics(_http(url + "/metrics", timeout=60).decode())
    for _ in range(tries):
        time.sleep(settle_s)
        now = parse_metrics(_http(url + "/metrics", timeout=60).decode())
        if now == last:
            return now
        last = now
    return last


class VLLMBenchmark:
    """The two phases of one evaluate run; ``stop()`` (on_kill, another thread) stops the running server."""

    def __init__(self, cfg: EvaluateConfig, health_timeout_s: float = 1800.0):
        self.cfg = cfg
        self.phases = ServerPhases()
        self.health_timeout_s = health_timeout_s
        # The servers' logs go into the run's EVAL folder when it is local (the temp folder for s3://).
        self.log_dir = (storage.join(cfg.out, "server-logs") if cfg.out and not storage.is_s3(cfg.out)
                        else tempfile.mkdtemp(prefix="eagle3-vllm-logs-"))

    def stop(self) -> None:
        self.phases.stop()

    def server(self, phase: str, target_dir: str, dtype: str):
        from eagle3.serving.vllm import VLLMServer, eagle3_speculative

        spec = eagle3_speculative(storage.local_dir(self.cfg.draft), self.cfg.steps) if phase == "eagle3" else None
        return VLLMServer(target_dir, port=self.cfg.port or free_port(), dtype=dtype, speculative=spec,
                          served_model_name="target", enforce_eager=self.cfg.vllm_enforce_eager,
                          log_path=f"{self.log_dir}/{phase}.log")

    def run_phase(self, phase: str, server, prompts: list[list[int]]) -> dict:
        cfg = self.cfg
        started = time.monotonic()

        def measure(server) -> dict:
            ready_s = time.monotonic() - started
            if cfg.warmup:
                complete(server.url, "target", prompts[0], 4)
            rows = []
            before = _stable_metrics(server.url)
            for ids in prompts:
                t0 = time.perf_counter()
                out = complete(server.url, "target", ids, cfg.max_new_tokens)
                out["seconds"] = time.perf_counter() - t0
                after = _stable_metrics(server.url)
                if phase == "eagle3":
                    out["counts"] = counts_between(before, after, cfg.steps)
                rows.append(out)
                before = after
            return {"start_s": ready_s, "requests": rows, "command": server.command()}

        return self.phases.run(server, measure, self.health_timeout_s)

    def measure(self) -> dict:
        """Both phases on every prompt; the report (not written, not gated: see run)."""
        from eagle3 import target as target_mod
        from eagle3.devices import resolve_device, resolve_precision
        from eagle3.evaluate.prompts import encode_prompt, load_prompt_sets

        cfg = self.cfg
        if not storage.exists(storage.join(cfg.draft, "config.json")):
            raise InputError(f"--draft {cfg.draft!r} has no config.json; point it at an `eagle3 export` output")
        sets = load_prompt_sets(cfg.prompts, cfg.limit)
        target_dir = target_mod.resolve_model(cfg.model)
        tokenizer = target_mod.load_tokenizer(target_dir)
        device = resolve_device(cfg.device)
        precision = resolve_precision(cfg.precision, device, workload="decode")  # one prompt at a time
        names = [(name, p) for name, ps in sets.items() for p in ps]
        ids = [encode_prompt(tokenizer, p) for _, p in names]
        base = self.run_phase("baseline", self.server("baseline", target_dir, precision.name), ids)
        spec = self.run_phase("eagle3", self.server("eagle3", target_dir, precision.name), ids)
        # A divergence is re-scored by the transformers target (fp32 and vLLM's precision), loaded only then.
        rescore = lossless.TargetRescorer(target_dir, device, precision.name)
        rows = []
        for (set_name, prompt), prompt_ids, b, s in zip(names, ids, base["requests"], spec["requests"]):
            c = s["counts"]
            row = {"set": set_name, "id": prompt.id, "prompt_tokens": len(prompt_ids),
                   "new_tokens": len(s["token_ids"]), "base_tokens": len(b["token_ids"]),
                   "stop": s["finish_reason"], "acceptance_length": acceptance.tau_of([c]),
                   "verifications": c["verifications"], "counts": c, "seconds_base": b["seconds"],
                   "seconds_spec": s["seconds"], "token_ids": s["token_ids"], "text": s["text"][:2000]}
            lossless.judge(row, prompt_ids, b["token_ids"], s["token_ids"], precision.name, rescore)
            row["first_difference"] = (row.get("mismatch") or {}).get("position")
            rows.append(row)
        from eagle3.export import exported_vocab

        draft_vocab = exported_vocab(storage.local_dir(cfg.draft))
        answers = {name: [b["token_ids"] for (n, _), b in zip(names, base["requests"]) if n == name] for name in sets}
        by_set = {name: _set_summary([r for r in rows if r["set"] == name], cfg.steps, precision.name,
                                     acceptance.vocab_reach(answers[name], draft_vocab))
                  for name in sets}
        primary = next(iter(by_set))
        return {
            **by_set[primary], "lossless": all(r["lossless"] for r in rows),
            "lossless_verdict": lossless.verdict(rows, precision.name), "primary_set": primary,
            "sets": by_set, "set_order": list(by_set), "steps": cfg.steps, "max_new_tokens": cfg.max_new_tokens,
            "prompts_source": primary, "target": cfg.model, "draft": cfg.draft, "backend": "vllm",
            "precision": precision.to_dict(), "device": device,
            "server": {"start_s": {"baseline": base["start_s"], "eagle3": spec["start_s"]},
                       "enforce_eager": cfg.vllm_enforce_eager,
                       "commands": {"baseline": base["command"], "eagle3": spec["command"]}},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "prompts": rows,
        }


def _set_summary(rows: list[dict], k: int, precision: str, reach: dict) -> dict:
    counts = [r["counts"] for r in rows]
    base_s, spec_s = sum(r["seconds_base"] for r in rows), sum(r["seconds_spec"] for r in rows)
    tps_base = sum(r["base_tokens"] for r in rows) / base_s if base_s > 0 else 0.0
    tps_spec = sum(r["new_tokens"] for r in rows) / spec_s if spec_s > 0 else 0.0
    return {"acceptance_length": acceptance.tau_of(counts), "accept_rate_by_position": acceptance.rates_of(counts),
            "tokens_per_s_spec": tps_spec, "tokens_per_s_base": tps_base,
            "speedup": tps_spec / tps_base if tps_base > 0 else 0.0, "num_prompts": len(rows),
            "generated_tokens": sum(r["new_tokens"] for r in rows),
            "verifications": sum(c["verifications"] for c in counts),
            "lossless_prompts": sum(r["lossless"] for r in rows),
            "lossless_verdict": lossless.verdict(rows, precision), "vocab_reach": reach}


def measure(cfg: EvaluateConfig) -> dict:
    return VLLMBenchmark(cfg).measure()
