"""Register an evaluated draft; publish it only if it beats the best so far.

  eagle3 publish --report EVAL/report.json --draft DRAFT --registry REGISTRY [--run-id ID]

REGISTRY (local or s3://) holds ``registry.json`` — every evaluated draft's
metrics and the decision taken — and ``drafts/<entry id>/``, the published
copies. A draft is published (copied there) only when all hold:

1. its evaluation was lossless,
2. the engines it was compared on agree on τ (a disagreement beyond what the prompts allow is a convention
   mismatch: the draft would serve at another τ than the one measured),
3. speculation beat the baseline in tokens/s (same run, same prompts) in the serving engines measured (vLLM,
   SGLang), else in the headline engine: a draft is shipped to a serving engine,
4. its τ beats the best τ published before on the same benchmark: same target, headline
   prompt set and prompt count, draft steps k, max_new_tokens, proposer, engine and precision (τ from other
   benchmarks is not comparable; the first draft on a benchmark only needs 1 to 3).

Otherwise it is recorded with ``published: false`` and the reason. The
decision (what was compared, and the outcome) is also written next to the
report as ``publish.json`` for the run report.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from eagle3 import storage
from eagle3.errors import InputError

log = logging.getLogger(__name__)

REGISTRY_FILE = "registry.json"
_REQUIRED = ("acceptance_length", "lossless", "tokens_per_s_spec", "tokens_per_s_base")


def _parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0] if "/" in uri else "."


def read_registry(registry: str) -> dict:
    """The registry document ({"entries": [...]}); empty when none exists yet."""
    uri = storage.join(registry, REGISTRY_FILE)
    if not storage.exists(uri):
        return {"entries": []}
    doc = storage.read_json(uri)
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise InputError(f"{uri} is not a draft registry (expected an object with an 'entries' list); "
                         "point --registry at another folder or fix the file")
    return doc


BENCHMARK_FIELDS = ("target", "prompts_source", "num_prompts", "steps", "max_new_tokens", "proposer", "backend",
                    "precision")
SERVING = ("vllm", "sglang")
"""The engines a draft is served by: the speed gate reads theirs when evaluate measured one."""


def benchmark_of(report_or_entry: dict) -> dict:
    """What a τ was measured on; two τ compare only when these are equal (the prompt subset, a prompt lookup in
    front of the draft, the engine and the precision all move τ). An entry of an older release lacks some:
    None, so it is not compared."""
    out = {k: report_or_entry.get(k) for k in BENCHMARK_FIELDS}
    if isinstance(out["precision"], dict):  # a report's {"name", "reason", ...}
        out["precision"] = out["precision"].get("name")
    if out["proposer"] is None and "backend" in report_or_entry and report_or_entry.get("backend") != "transformers":
        out["proposer"] = "draft"  # vLLM and SGLang serve the draft alone
    return out


def best_published(doc: dict, benchmark: dict | None = None) -> dict | None:
    """The published entry with the highest τ (on ``benchmark`` when given), or None."""
    published = [e for e in doc["entries"] if e.get("published")
                 and (benchmark is None or benchmark_of(e) == benchmark)]
    return max(published, key=lambda e: e["acceptance_length"]) if published else None


def _benchmark_text(b: dict) -> str:
    return (f"{b['prompts_source']} ({b.get('num_prompts')} prompts), k={b['steps']}, {b['max_new_tokens']} new "
            f"tokens, {b.get('backend')} in {b.get('precision')}, proposer {b.get('proposer')}, target {b['target']}")


def speeds(report: dict) -> dict[str, tuple[float, float]]:
    """{engine: (speculative, baseline tok/s)} the speed gate reads: the serving engines evaluate measured, else
    the headline engine."""
    engines = report.get("engines") or {}
    serving = {n: (f["tokens_per_s_spec"], f["tokens_per_s_base"]) for n, f in engines.items() if n in SERVING}
    return serving or {report.get("backend") or "headline": (report["tokens_per_s_spec"], report["tokens_per_s_base"])}


def decide(report: dict, best: dict | None) -> tuple[bool, str]:
    """(publish?, reason) for an evaluation report against the best published entry."""
    tau = report["acceptance_length"]
    if not report["lossless"]:
        return False, "the evaluation was not lossless (speculative output differed from greedy)"
    for name, a in (report.get("agreement") or {}).items():
        t = a.get("tau") or {}
        if not t.get("agree", True):
            iv = t.get("interval") or (None, None)
            return False, (f"{name} and {a.get('against')} disagree on τ by {t.get('difference', 0):+.3f} "
                           f"(interval [{iv[0]:+.3f}, {iv[1]:+.3f}] over {a.get('prompts')} prompts): a convention "
                           "mismatch between the engines (aux layers, d2t, norms), so the draft would not serve at "
                           "the τ measured")
    measured = speeds(report)
    slow = {n: v for n, v in measured.items() if not v[0] > v[1]}
    if slow:
        return False, "speculation is not faster than the baseline: " + "; ".join(
            f"{n} {s:.2f} vs {b:.2f} tok/s" for n, (s, b) in slow.items())
    if best is not None and not tau > best["acceptance_length"]:
        return False, (f"τ {tau:.3f} does not beat the previous best {best['acceptance_length']:.3f} "
                       f"(entry {best['id']})")
    prev = f"is the first draft published on this benchmark ({_benchmark_text(benchmark_of(report))})" \
        if best is None else f"beats the previous best τ {best['acceptance_length']:.3f} (entry {best['id']})"
    faster = "; ".join(f"{n} {s:.2f} vs {b:.2f} tok/s" for n, (s, b) in measured.items())
    return True, f"τ {tau:.3f} {prev}, and speculation is faster ({faster})"


def _copy_dir(src: str, dest: str) -> list[str]:
    names = storage.list_files(src)
    if "config.json" not in names:
        raise InputError(f"--draft {src!r} has no config.json; point it at an `eagle3 export` output")
    # config.json last: a published folder with a config is complete (as export writes it).
    for name in sorted(names, key=lambda n: n == "config.json"):
        storage.put_file(storage.local_path(storage.join(src, name)), storage.join(dest, name))
    return names


@dataclass(frozen=True)
class PublishConfig:
    report: str
    """EVAL/report.json written by `eagle3 evaluate`."""
    draft: str
    """The evaluated DRAFT folder (what is copied when it wins)."""
    registry: str
    """Registry folder (local or s3://): registry.json and drafts/<entry id>/."""
    run_id: str | None = None
    """A label stored with the entry (the Airflow run id)."""


def publish(cfg: PublishConfig) -> dict[str, Any]:
    """Record the evaluated draft in REGISTRY/registry.json and publish it if it wins.

    Returns {"published", "reason", "location" (the published copy or None),
    "acceptance_length", "compared": {...}, "registry", "entry_id"}.
    """
    report, draft, registry, run_id = cfg.report, cfg.draft, cfg.registry, cfg.run_id
    rep = storage.read_json(report)
    missing = [k for k in _REQUIRED if k not in rep]
    if missing:
        raise InputError(f"{report} lacks {', '.join(missing)}; is it an `eagle3 evaluate` report.json?")
    weights = storage.join(draft, "model.safetensors")
    if not storage.exists(weights):
        raise InputError(f"--draft {draft!r} has no model.safetensors; point it at an `eagle3 export` output")
    digest = storage.sha256_file(storage.local_path(weights))
    doc = read_registry(registry)
    again = next((e for e in doc["entries"] if e.get("sha256") == digest and e.get("published")), None)
    benchmark = benchmark_of(rep)
    best = best_published(doc, benchmark)
    elsewhere = sum(1 for e in doc["entries"] if e.get("published") and benchmark_of(e) != benchmark)
    compared = {
        "benchmark": benchmark,
        "published_on_other_benchmarks": elsewhere,
        "acceptance_length": rep["acceptance_length"], "lossless": rep["lossless"],
        "tokens_per_s_spec": rep["tokens_per_s_spec"], "tokens_per_s_base": rep["tokens_per_s_base"],
        "speedup": rep.get("speedup"),
        "previous_best": None if best is None else {k: best.get(k) for k in
                                                     ("id", "acceptance_length", "tokens_per_s_spec",
                                                      "tokens_per_s_base", "location", "run_id")},
    }
    if again is not None:  # a retried task: the same weights were already published
        result = {"published": True, "reason": f"already published as entry {again['id']}",
                  "location": again["location"], "acceptance_length": again["acceptance_length"],
                  "compared": compared, "registry": registry, "entry_id": again["id"]}
        storage.write_json(storage.join(_parent(report), "publish.json"), result)
        return result
    ok, reason = decide(rep, best)
    if elsewhere:
        reason += f"; {elsewhere} draft(s) published on other benchmarks were not compared"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    entry_id = f"{stamp}-{digest[:12]}"
    if run_id:
        entry_id += "-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)[:60]
    location = storage.join(registry, "drafts", entry_id) if ok else None
    if ok:
        _copy_dir(draft, location)
    doc["entries"].append({
        "id": entry_id, "run_id": run_id, "draft": draft, "report": report, "sha256": digest,
        "published": ok, "reason": reason, "location": location, "evaluated_at": rep.get("created_at"),
        "decided_at": stamp, "acceptance_length": rep["acceptance_length"], "lossless": rep["lossless"],
        "tokens_per_s_spec": rep["tokens_per_s_spec"], "tokens_per_s_base": rep["tokens_per_s_base"],
        "speedup": rep.get("speedup"), "accept_rate_by_position": rep.get("accept_rate_by_position"),
        "sim_accept_len": rep.get("sim_accept_len"), **benchmark,
        "engines": {n: {k: f.get(k) for k in ("tau", "speedup", "tokens_per_s_spec", "tokens_per_s_base", "precision")}
                    for n, f in (rep.get("engines") or {}).items()},
    })
    best_now = best_published(doc, benchmark)
    doc["best"] = None if best_now is None else best_now["id"]  # on the benchmark of the latest decision
    doc.setdefault("best_by_benchmark", {})[_benchmark_text(benchmark)] = doc["best"]
    storage.write_json(storage.join(registry, REGISTRY_FILE), doc)
    result = {"published": ok, "reason": reason, "location": location,
              "acceptance_length": rep["acceptance_length"], "compared": compared, "registry": registry,
              "entry_id": entry_id}
    storage.write_json(storage.join(_parent(report), "publish.json"), result)
    log.info("publish: %s — %s", "PUBLISHED" if ok else "not published", reason)
    return result


def say(cfg: PublishConfig, result: dict[str, Any]) -> str:
    """What `eagle3 publish` prints before the JSON: the verdict."""
    return ("PUBLISHED to " + result["location"]) if result["published"] else "NOT PUBLISHED: " + result["reason"]
