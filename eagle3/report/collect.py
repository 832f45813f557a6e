"""What a run's report says, read from the run's files: the one data model of report.html and the UI's report tab.

    collect(paths, results=None, status=None) -> dict     # every section, None where its files do not exist yet

The report stage writes it into report.json (with its plots and what it could not plot) and renders report.html
from it; the Airflow UI's report tab builds it the same way while the run is still going, before any report
exists. Both pages format it through :mod:`eagle3.report.view`, so they differ in layout only. ``paths`` are a
run's folders (``eagle3.layout.RunLayout.paths()``: stats, merged, checkpoint, eval, prepared, store; any may be
missing or None); ``results`` are the run's task results (:func:`task_results`). Torch-free; every read goes
through eagle3.storage (local or s3://), and an unreadable file is logged and leaves its section out.

Sections: ``status`` (eagle3.report.summary.run_status), ``acceptance`` (every engine and prompt set's τ, rates,
tok/s and lossless verdict, the offline estimate, the publish decision and the previous best), ``evaluate`` (EVAL/
report.json without its prompts), ``publish`` (EVAL/publish.json), ``sglang``, ``datasets`` (rows, flags, where
from), ``training`` (metrics.jsonl's counts and last events, the newest checkpoint), ``verify`` (MERGED/
verify.json), ``extraction`` (the store's index files, this run's extract tasks), ``reuse`` (what the run did not
redo).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from eagle3 import layout, storage
from eagle3.errors import InputError

log = logging.getLogger(__name__)

try:  # an S3 error (access denied, no such bucket) must not take a page down: the section is left out
    from botocore.exceptions import BotoCoreError, ClientError

    READ_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, BotoCoreError, ClientError)
except ImportError:  # local artifacts only
    READ_ERRORS = (OSError, ValueError)

STATS_TABLE = "stats_table.json"
TRAINING_KEYS = ("step", "loss_i", "acc_i", "sim_accept_len")  # what a plot and the report keep of an event


def read_json(uri: str | None) -> Any | None:
    """A JSON file, or None when it is missing or unreadable (logged: the page still renders)."""
    if not uri:
        return None
    try:
        return storage.read_json(uri) if storage.exists(uri) else None
    except READ_ERRORS as e:
        log.warning("could not read %s (%s); that part is left out", uri, e)
        return None


def list_files(folder: str | None) -> list[str]:
    if not folder:
        return []
    try:
        return storage.list_files(folder)
    except READ_ERRORS as e:
        log.warning("could not list %s: %s", folder, e)
        return []


def _dict(value: Any) -> dict | None:
    return value if isinstance(value, dict) else None


# -- the run's tasks --------------------------------------------------------------------------

def task_results(summaries: str) -> dict[str, Any]:
    """{task_id: result, or [results] of a mapped task in map-index order} from a run's summaries folder."""
    results: dict[str, Any] = {}
    mapped: dict[str, list[tuple[int, Any]]] = {}
    for name in list_files(summaries):
        if "/" in name or not name.endswith(".json"):
            continue
        stem = name[: -len(".json")]
        task, _, index = stem.rpartition(".")  # task ids may hold dots (task groups): the map index is last
        value = read_json(storage.join(summaries, name))
        if task and index.isdigit():
            mapped.setdefault(task, []).append((int(index), value))
        else:
            results[stem] = value
    for task, items in mapped.items():
        results[task] = [v for _, v in sorted(items, key=lambda iv: iv[0])]
    return results


def reuse_of(results: Mapping[str, Any]) -> dict[str, Any]:
    """What the run did not redo: {"tokenize": {dataset: "reused"|"tokenized"}, "extracted_samples",
    "reused_samples", "extracted_tokens"} from the tokenize and extract tasks' results."""
    tokenized = {}
    for result in results.get("tokenize") or []:
        for name, s in ((result or {}).get("datasets") or {}).items():
            tokenized[name] = "reused" if s.get("reused") else "tokenized"
    extracted = [s for s in results.get("extract") or [] if isinstance(s, dict)]
    return {"tokenize": tokenized,
            "extracted_samples": sum(s.get("samples_extracted", 0) for s in extracted),
            "reused_samples": sum(s.get("samples_skipped", 0) for s in extracted),
            "extracted_tokens": sum(s.get("tokens", 0) for s in extracted)}


_PRECEDENCE = ("failed", "upstream_failed", "running", "queued", "scheduled", "up_for_retry", "deferred", "none",
               "success", "skipped")


def task_state_map(tasks: list[dict] | None) -> dict[str, str]:
    """{task_id: state}; a mapped task's instances folded into one (any failed: failed; then any not
    finished; all skipped: skipped)."""
    out: dict[str, str] = {}
    for t in tasks or []:
        state = t.get("state") or "none"
        before = out.get(t["task_id"])
        rank = _PRECEDENCE.index(state) if state in _PRECEDENCE else 7
        if before is None or rank < (_PRECEDENCE.index(before) if before in _PRECEDENCE else 7):
            out[t["task_id"]] = state
    return out


# -- sections ---------------------------------------------------------------------------------

def read_datasets(paths: Mapping[str, str | None], reuse: Mapping[str, Any] | None = None) -> dict | None:
    """{"rows", "flagged", "origin"}: the stats stage's table (RUN/stats/stats_table.json), else the stats.json of
    each dataset this run tokenized (the prepared folder is shared between runs: never another run's), else the
    merged manifest's sources; each row with its tokenize reuse when known."""
    rows: list[dict] = []
    flagged: list[dict] = []
    origin = None
    stats, prepared, merged = paths.get("stats"), paths.get("prepared"), paths.get("merged")
    table = _dict(read_json(storage.join(stats, STATS_TABLE) if stats else None))
    if table and isinstance(table.get("datasets"), list):
        rows = [dict(r) for r in table["datasets"] if isinstance(r, dict) and "dataset" in r]
        flagged = [{"dataset": f.get("dataset"), "reason": f.get("message", "")} for f in table.get("flags") or []]
        origin = storage.join(stats, STATS_TABLE)
    state = (reuse or {}).get("tokenize") or {}  # this run's tokenize tasks: {dataset: reused or tokenized}
    if not rows and prepared and state:
        for name in list_files(prepared):
            if name.count("/") == 1 and name.endswith("/stats.json") and name.split("/")[0] in state:
                doc = _dict(read_json(storage.join(prepared, name))) or {}
                if "samples" in doc and "tokens" in doc:
                    rows.append({"dataset": doc.get("dataset", name.split("/")[0]),
                                 "samples": int(doc["samples"]), "tokens": int(doc["tokens"])})
        origin = storage.join(prepared, "*/stats.json")
    if not rows and merged:
        manifest = _dict(read_json(storage.join(merged, layout.MERGED_MANIFEST))) or {}
        rows = [{"dataset": k, "samples": int(v.get("samples_out", 0)), "tokens": int(v.get("tokens_out", 0))}
                for k, v in (manifest.get("sources") or {}).items()]
        origin = storage.join(merged, layout.MERGED_MANIFEST)
    if not rows:
        return None
    if any("sample_share" not in r or "token_share" not in r for r in rows):
        total_s = sum(int(r.get("samples") or 0) for r in rows) or 1
        total_t = sum(int(r.get("tokens") or 0) for r in rows) or 1
        for r in rows:
            r["sample_share"] = int(r.get("samples") or 0) / total_s
            r["token_share"] = int(r.get("tokens") or 0) / total_t
    for r in rows:
        if r["dataset"] in state:
            r["reused"] = state[r["dataset"]] == "reused"
    return {"rows": sorted(rows, key=lambda r: str(r["dataset"])), "flagged": flagged, "origin": origin}


def training_curves(checkpoint: str | None) -> dict | None:
    """{"train": [...], "eval": [...]} events of CKPT/metrics.jsonl (eagle3.checkpoint's schema)."""
    from eagle3.checkpoint import METRICS_FILE, read_metrics

    if not checkpoint:
        return None
    try:
        events = read_metrics(storage.join(checkpoint, METRICS_FILE))
    except (InputError,) + READ_ERRORS as e:
        log.warning("could not read the metrics of %s (%s); training curves are left out", checkpoint, e)
        return None
    out: dict[str, list[dict]] = {"train": [], "eval": []}
    for ev in events:
        if ev.get("event") in out:
            out[ev["event"]].append({k: ev.get(k) for k in TRAINING_KEYS})
    return out if out["train"] or out["eval"] else None


def read_training(checkpoint: str | None) -> dict | None:
    """Metric events counted, the last event (its scalars, and its per-TTT-step lists), the last train and eval
    events, and the newest complete checkpoint step."""
    from eagle3.checkpoint import METRICS_FILE, latest_step_dir, read_metrics

    if not checkpoint:
        return None
    try:
        events = read_metrics(storage.join(checkpoint, METRICS_FILE))
        latest = latest_step_dir(checkpoint)
    except (InputError,) + READ_ERRORS as e:  # a half-written run must not take the page down
        log.warning("could not read the checkpoint folder %s: %s", checkpoint, e)
        return None
    if not events and latest is None:
        return None
    last = events[-1] if events else {}
    kinds = {kind: [e for e in events if e.get("event") == kind] for kind in ("train", "eval")}
    per_step = {k: v for k, v in last.items()
                if isinstance(v, list) and v and all(isinstance(x, (int, float, type(None))) for x in v)}
    return {"events": len(events), "train_events": len(kinds["train"]), "eval_events": len(kinds["eval"]),
            "last": {k: v for k, v in last.items() if not isinstance(v, (list, dict))} if events else None,
            "per_step": per_step or None, "latest": latest.rsplit("/", 1)[-1] if latest else None,
            **{f"last_{kind}": {k: e[-1].get(k) for k in TRAINING_KEYS} if e else None for kind, e in kinds.items()}}


def acceptance(ev: dict | None, publish: dict | None = None, training: dict | None = None) -> dict | None:
    """τ, rates, tok/s and the lossless verdict of every engine and prompt set (eagle3.report.summary labels
    them), the offline estimate, the publish decision and the previous best draft."""
    from eagle3.report.summary import headline_rows, lossless_text, tie_flips, vocab_reach_text

    if not isinstance(ev, dict):
        return None
    publish = publish or {}
    previous = (publish.get("compared") or {}).get("previous_best")
    precision = ev.get("precision")
    return {
        "rows": headline_rows(ev), "tau": ev.get("acceptance_length"), "lossless": ev.get("lossless"),
        "lossless_text": lossless_text(ev), "speedup": ev.get("speedup"),
        "tokens_per_s_spec": ev.get("tokens_per_s_spec"), "tokens_per_s_base": ev.get("tokens_per_s_base"),
        "steps": ev.get("steps"), "max_new_tokens": ev.get("max_new_tokens"), "prompts": ev.get("num_prompts"),
        "sim_accept_len": ev.get("sim_accept_len_k") or _offline_at_k(training, ev.get("steps"))
        or ev.get("sim_accept_len"),
        "accept_rate_by_position": ev.get("accept_rate_by_position"), "backend": ev.get("backend"),
        "device": ev.get("device"), "precision": precision.get("name") if isinstance(precision, dict) else precision,
        "tie_flips": tie_flips(ev), "agreement": ev.get("agreement") or {},
        "vocab_reach": vocab_reach_text(ev),
        "previous": previous if isinstance(previous, dict) else None,
        "published": publish.get("published"), "publish_reason": publish.get("reason"),
    }


def _offline_at_k(training: dict | None, k: int | None) -> float | None:
    """The trainer's offline estimate over the k draft steps evaluate used (a vLLM or SGLang report has none of its
    own): the last held-out evaluation's acc_i cut to k, as the project decoder's report computes it. Over all the
    TTT steps it would exceed the k + 1 that τ is capped at."""
    from eagle3.acceptance import simulated_acceptance_length

    acc = ((training or {}).get("last_eval") or {}).get("acc_i")
    return simulated_acceptance_length(list(acc)[:k]) if acc and k else None


def read_extraction(paths: Mapping[str, str | None], results: Mapping[str, Any]) -> dict | None:
    """Shards, samples and tokens written so far, from the store's index files (eagle3.extract.store_format),
    against the merged set's size, and this run's extract tasks' results summed."""
    from eagle3.extract.store_format import is_index_name

    stores: dict[str, dict] = {}
    store = paths.get("store")
    for name in list_files(store):
        folder, _, base = name.rpartition("/")
        if not is_index_name(base):
            continue
        index = _dict(read_json(storage.join(store, name))) or {}
        entry = stores.setdefault(folder, {"store": folder, "tasks": 0, "shards": 0, "samples": 0, "tokens": 0})
        entry["tasks"] += 1
        for shard in index.values():
            entry["shards"] += 1
            entry["samples"] += int(shard.get("samples", 0))
            entry["tokens"] += int(shard.get("tokens", 0))
    merged = paths.get("merged")
    manifest = _dict(read_json(storage.join(merged, layout.MERGED_MANIFEST) if merged else None))
    planned = (manifest.get("totals") or {}).get("samples_out") if manifest else None
    done = [r for r in results.get("extract") or [] if isinstance(r, dict)]
    summary = None
    if done:
        keys = ("samples_in_task", "samples_skipped", "samples_extracted", "tokens", "shards_written",
                "bytes_written")
        summary = {"tasks": len(done), **{k: sum(int(r.get(k) or 0) for r in done) for k in keys}}
    if not stores and not summary:
        return None
    return {"stores": list(stores.values()), "planned_samples": planned, "summary": summary}


def collect(paths: Mapping[str, str | None], results: Mapping[str, Any] | None = None,
            status: dict | None = None) -> dict[str, Any]:
    """The run's report content from its files (see the module docstring); a section is None until its files
    exist."""
    results = results or {}
    reuse = reuse_of(results)
    evaluation = paths.get("eval")
    ev = _dict(read_json(storage.join(evaluation, layout.EVAL_REPORT) if evaluation else None))
    publish = _dict(read_json(storage.join(evaluation, "publish.json") if evaluation else None))
    sglang = _dict(read_json(storage.join(evaluation, layout.engine_report("sglang")) if evaluation else None))
    training = read_training(paths.get("checkpoint"))
    merged = paths.get("merged")
    return {
        "status": status,
        "acceptance": acceptance(ev, publish, training),
        "evaluate": None if ev is None else {k: v for k, v in ev.items() if k not in ("prompts", "offline")},
        "publish": publish,
        "sglang": None if sglang is None else {k: v for k, v in sglang.items() if k != "phases"},
        "datasets": read_datasets(paths, reuse),
        "training": training,
        "verify": _dict(read_json(storage.join(merged, layout.VERIFY_RESULT) if merged else None)),
        "extraction": read_extraction(paths, results),
        "reuse": reuse,
    }
