"""The regenerate stage: each ``regenerate: true`` dataset, answered again by the target.

``regenerate(cfg)`` replays every conversation (see replay.py) through a
backend (``openai``: an HTTP server; ``hf``: transformers in-process), appends
each finished conversation to ``OUT/<dataset>/regenerated.jsonl``, writes
``stats.json`` and ``errors.jsonl``, and writes ``OUT/manifest.yaml`` in which
the regenerated datasets' sources are replaced, for the tokenize stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import time
from dataclasses import asdict
from typing import Any, Iterator

from eagle3 import storage
from eagle3.errors import InputError
from eagle3.progress import Progress
from eagle3.regenerate import output
from eagle3.regenerate.config import BASE_URL_ENV, RegenerateConfig, TooManyErrors
from eagle3.regenerate.conversations import BadRecord, Conversation, read_conversations
from eagle3.regenerate.replay import Completion, RequestFailed, replay

log = logging.getLogger(__name__)

MAX_TOKENS_WARN_SHARE = 0.05
"""Share of a dataset's regenerated answers that stopped at max_tokens (finish_reason "length") above which the
stage warns. Such an answer is cut mid-sentence, and the chat template closes it with an end-of-turn token the
target did not emit there, so the draft learns to end answers early; a few cut in the long tail are normal, more
mean max_tokens is below the target's usual answer length."""


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]+@", "//***@", url)


def _make_backend(cfg: RegenerateConfig, api_key: str | None):
    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens, seed=cfg.seed)
    if cfg.backend == "hf":
        from eagle3.regenerate.hf_backend import HFBackend

        return HFBackend(cfg.model, batch_size=cfg.concurrency, device=cfg.device, precision=cfg.precision,
                         **sampling)
    from eagle3.regenerate.openai_backend import OpenAIBackend

    base_url = cfg.base_url or os.environ.get(BASE_URL_ENV) or os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        raise InputError("regenerate: backend openai needs a server URL: pass --base-url "
                         f"(e.g. http://127.0.0.1:30000/v1) or set {BASE_URL_ENV}")
    if api_key is None:
        api_key = os.environ.get(cfg.api_key_env) or os.environ.get("OPENAI_API_KEY")
    log.info("regenerate: openai backend at %s, model %s, %d in flight, key %s", _redact(base_url), cfg.model,
             cfg.concurrency, "set" if api_key else "not set")
    return OpenAIBackend(base_url, cfg.model, api_key, concurrency=cfg.concurrency, timeout_s=cfg.timeout_s,
                         max_retries=cfg.max_retries, backoff_s=cfg.backoff_s, extra_body=cfg.extra_body,
                         **sampling)


class _Meter:
    """Wraps a backend's complete(): counts what the server reported for every successful request."""

    def __init__(self, backend):
        self.backend = backend
        self.requests = self.prompt_tokens = self.completion_tokens = 0

    async def complete(self, messages, tools) -> Completion:
        c = await self.backend.complete(messages, tools)
        self.requests += 1
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        return c


def _record(conv: Conversation, spec_source: str, settings: dict, result) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": conv.id, "messages": result.messages}
    if conv.tools:
        rec["tools"] = conv.tools
    rec["original_messages"] = conv.messages
    rec["source"] = {"file": spec_source, "line": conv.line}
    rec["regeneration"] = {**settings, "prompt_tokens": result.prompt_tokens,
                           "completion_tokens": result.completion_tokens, "turns": result.turns}
    if result.truncated:
        rec["regeneration"]["truncated"] = result.truncated
    return rec


class _Progress(Progress):
    """Progress lines that also count this run's answers cut at max_tokens (seen while the run is long)."""

    at_max_tokens = 0

    def line(self) -> str:
        return super().line() + (f", {self.at_max_tokens} answers cut at max_tokens" if self.at_max_tokens else "")


def _read(spec, done: dict) -> tuple[list[Conversation], dict[str, int], list[tuple[int, str]], int]:
    """The conversations still to do, every good one's resume key -> line (source order), the bad records
    (line, reason) and the record count."""
    todo: list[Conversation] = []
    lines: dict[str, int] = {}
    bad: list[tuple[int, str]] = []
    total = 0
    for line, item in read_conversations(spec.source, spec.format, spec.max_samples):
        total += 1
        if isinstance(item, BadRecord):
            bad.append((line, str(item)))
            continue
        key = item.key
        lines[key] = line
        if key not in done:
            todo.append(item)
    return todo, lines, bad, total


async def _run_dataset(cfg: RegenerateConfig, spec, backend) -> dict[str, Any]:
    start = time.monotonic()
    local = output.work_dir(cfg.out, spec.name)
    local.mkdir(parents=True, exist_ok=True)
    if not cfg.restart:
        output.fetch_previous(local, cfg.out, spec.name, cfg.settings())
    records = output.RecordLog(local / output.RECORDS, cfg.settings(), restart=cfg.restart)
    try:  # read before errors.jsonl is emptied: an input refused (duplicate ids) leaves the earlier one
        todo, lines, bad_records, total = _read(spec, records.done)
    except BaseException:
        records.close()
        raise
    errors = output.ErrorLog(local / output.ERRORS, spec.source)
    for line, reason in bad_records:
        errors.add(line, None, reason, kind="bad_record")
    bad = len(bad_records)
    meter = _Meter(backend)
    resumed = len(lines) - len(todo)
    turns = sum(sum(m["role"] == "assistant" for m in c.messages) + 1 for c in todo)
    progress = _Progress(f"regenerate[{spec.name}]", total_samples=len(todo),
                         total_tokens=turns * cfg.max_tokens, tokens_are_upper_bound=True, kept=resumed)
    log.info("regenerate[%s]: %d conversations, %d already done, %d to do, %d bad records",
             spec.name, total, resumed, len(todo), bad)
    failed = 0
    queue: Iterator[Conversation] = iter(todo)

    async def worker() -> None:
        nonlocal failed
        for conv in queue:  # workers share one iterator: each conversation is taken once
            try:
                result = await replay(conv, meter.complete, cfg.answer_trailing)
            except RequestFailed as e:
                failed += 1
                errors.add(conv.line, conv.id, e.reason, kind="request_failed", attempts=e.attempts)
                continue
            records.append(_record(conv, spec.source, cfg.settings(), result))
            progress.at_max_tokens += sum(t["finish_reason"] == "length" for t in result.turns)
            progress.update(samples=1, tokens=result.completion_tokens)

    try:
        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
    finally:
        errors.close()
        wall = time.monotonic() - start
        finished = sum(k in records.done for k in lines)
        complete = finished + failed + bad == total
        if complete and not records.in_order(lines):
            records.rewrite(lines)
        records.close()
        stats = _stats(cfg, spec, records, total, resumed, bad, failed, meter, backend, wall, complete)
        storage.write_json(str(local / output.STATS), stats)
        output.publish(local, cfg.out, spec.name)
    progress.finish()
    log.info("regenerate[%s]: %d done (%d this run, %d resumed), %d failed, %d bad; %d of %d answers stopped at "
             "max_tokens; this run %d requests (%d retries), %d prompt + %d completion tokens, %.1f s, "
             "%.0f completion tok/s, $%.4f",
             spec.name, len(records.done), len(records.done) - resumed, resumed, failed, bad,
             stats["turns_at_max_tokens"], stats["requests"], meter.requests, backend.retries, meter.prompt_tokens,
             meter.completion_tokens, wall, stats["this_run"]["completion_tokens_per_s"],
             stats["this_run"]["cost_usd"])
    cut, answers = stats["turns_at_max_tokens"], stats["requests"]
    if answers and cut / answers > MAX_TOKENS_WARN_SHARE:
        log.warning("regenerate[%s]: %d of %d answers (%.1f%%) stopped at max_tokens=%d, cut mid-answer; the draft "
                    "learns to end answers where they were cut. Raise --max-tokens (Airflow: regenerate_max_tokens) "
                    "and regenerate (a new --out, or --restart / \"Regenerate from scratch\")",
                    spec.name, cut, answers, 100 * cut / answers, cfg.max_tokens)
    if not stats["passed"]:
        raise TooManyErrors(
            f"regenerate[{spec.name}]: {failed} of {total} conversations failed ({stats['error_share']:.1%} > "
            f"max_error_share {cfg.max_error_share:.1%}); reasons in {storage.join(cfg.out, spec.name, 'errors.jsonl')}"
            "; fix the server and run again (finished conversations are kept)")
    return stats


def _stats(cfg, spec, records, total, resumed, bad, failed, meter, backend, wall, complete) -> dict[str, Any]:
    done = records.done.values()
    prompt = sum(d["prompt_tokens"] for d in done)
    completion = sum(d["completion_tokens"] for d in done)
    error_share = failed / total if total else 0.0
    return {
        "dataset": spec.name, "source": spec.source, "output": storage.join(cfg.out, spec.name, output.RECORDS),
        "format": "messages", "settings": cfg.settings(), "conversations": total, "done": len(records.done),
        "resumed": resumed, "failed": failed, "bad_records": bad, "error_share": error_share,
        "max_error_share": cfg.max_error_share, "passed": error_share <= cfg.max_error_share,
        "complete": complete, "truncated": sum(d["truncated"] for d in done),
        # Answers (of "requests") that stopped at max_tokens: cut mid-answer (MAX_TOKENS_WARN_SHARE).
        "turns_at_max_tokens": sum(d["at_max_tokens"] for d in done),
        # Tokens held by the output file, summed from each record's server-reported usage.
        "requests": sum(d["requests"] for d in done), "prompt_tokens": prompt, "completion_tokens": completion,
        "cost_usd": cfg.cost(prompt, completion),
        "prices_per_m": {"prompt": cfg.price_prompt_per_m, "completion": cfg.price_completion_per_m},
        # What this run asked the server for, failed conversations' finished turns included (they were billed).
        "this_run": {"requests": meter.requests, "attempts": backend.attempts, "retries": backend.retries,
                     "prompt_tokens": meter.prompt_tokens, "completion_tokens": meter.completion_tokens,
                     "cost_usd": cfg.cost(meter.prompt_tokens, meter.completion_tokens), "wall_s": round(wall, 3),
                     "completion_tokens_per_s": meter.completion_tokens / wall if wall > 0 else 0.0,
                     # hf: this run's compute precision (not a setting: "auto" may resolve differently on
                     # another machine, so a resumed dataset may mix both); openai: None, the server's own.
                     "precision": backend.precision.to_dict() if getattr(backend, "precision", None) else None},
    }


def _selected(cfg: RegenerateConfig):
    from eagle3.datasets.manifest import load_manifest

    specs = load_manifest(cfg.manifest)
    by_name = {s.name: s for s in specs}
    for name in cfg.datasets:
        if name not in by_name:
            raise InputError(f"regenerate: dataset {name!r} is not in {cfg.manifest}; "
                             f"it has {', '.join(by_name)}")
        if not by_name[name].regenerate:
            raise InputError(f"{cfg.manifest}: dataset {name!r} has no 'regenerate: true'; set it there first")
    return [s for s in specs if s.regenerate and (not cfg.datasets or s.name in cfg.datasets)]


class _ServedBackend:
    """The openai backend on a server of its own (``cfg.server``), started at the first request and
    stopped on exit: a re-run whose conversations are all done starts no server (nor leases its GPUs)."""

    def __init__(self, cfg: RegenerateConfig, api_key: str | None):
        self.cfg, self.api_key = cfg, api_key or "EMPTY"
        self.stack = contextlib.AsyncExitStack()
        self.inner = None
        self.error: BaseException | None = None  # a failed start fails every later request, no second start
        self.lock = asyncio.Lock()

    attempts = property(lambda self: self.inner.attempts if self.inner else 0)
    retries = property(lambda self: self.inner.retries if self.inner else 0)

    async def __aenter__(self) -> "_ServedBackend":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stack.aclose()  # the client first, then the server (LIFO)

    async def complete(self, messages, tools) -> Completion:
        async with self.lock:
            if self.error is not None:
                raise self.error
            if self.inner is None:
                try:
                    # Started in the loop's own thread, blocking it: every worker waits for the server anyway,
                    # and a SIGTERM (on_kill) raised while it starts stops it through _served's finally.
                    url = self.stack.enter_context(_served(self.cfg))
                    self.inner = await self.stack.enter_async_context(_make_backend(dataclasses.replace(
                        self.cfg, base_url=url, server=None), self.api_key))
                except BaseException as e:
                    self.error = e
                    raise
        return await self.inner.complete(messages, tools)


async def _run_all(cfg: RegenerateConfig, specs, api_key: str | None) -> dict[str, Any]:
    results = {}
    async with (_ServedBackend(cfg, api_key) if cfg.server else _make_backend(cfg, api_key)) as backend:
        for spec in specs:
            results[spec.name] = await _run_dataset(cfg, spec, backend)
    return results


def _engine_server(cfg: RegenerateConfig):
    """The ManagedServer that serves ``cfg.model`` under that name (what the openai path sends as ``model``)."""
    from eagle3.serving import free_port

    port = cfg.server_port or free_port()
    # Its log goes into the regenerated folder when that is local (each start a fresh one, the previous kept).
    log_path = None if storage.is_s3(cfg.out) else storage.join(cfg.out, f"{cfg.server}-server.log")
    if cfg.server == "vllm":
        from eagle3.devices import resolve_device, resolve_precision
        from eagle3.serving.vllm import VLLMServer
        from eagle3.target import resolve_model

        # The target's compute precision, resolved as the hf backend does (vLLM's --dtype; "auto" is ours).
        device = resolve_device("auto")
        dtype = resolve_precision(cfg.precision, device).name
        tp = ["--tensor-parallel-size", str(cfg.server_tp)] if cfg.server_tp > 1 else []
        # On CPU torch.compile made a start 4 min longer here (docs/vllm.md); on GPUs CUDA graphs pay off.
        return VLLMServer(resolve_model(cfg.model), port=port, dtype=dtype, served_model_name=cfg.model,
                          enforce_eager=device == "cpu", extra_args=[*tp, *cfg.server_args], log_path=log_path)
    from eagle3.serving.sglang import SGLangServer

    return SGLangServer(cfg.model, tp=cfg.server_tp, port=port, extra_args=cfg.server_args, log_path=log_path)


@contextlib.contextmanager
def _served(cfg: RegenerateConfig):
    """Start the engine ``cfg.server`` on the model; yield its OpenAI base URL; stop it on any exit."""
    from eagle3.devices import lease_device

    # The lease narrows CUDA_VISIBLE_DEVICES for the block (a no-op without GPUs); the server inherits it.
    with lease_device(cfg.server_tp):
        server = _engine_server(cfg)
        try:
            server.start().wait_healthy(timeout=1800)
            yield server.url + "/v1"
        finally:
            server.stop()


def run(cfg: RegenerateConfig, api_key: str | None = None) -> dict[str, Any]:
    """Regenerate the selected datasets; returns ``{"manifest": derived manifest URI, "datasets": {name: stats},
    "incomplete": {name: why}}`` (``regenerate: true`` datasets the derived manifest keeps on their source).

    ``api_key`` (openai) overrides the environment variable named by ``cfg.api_key_env``;
    pass it from an Airflow connection. It is never logged or written.
    """
    if cfg.server:  # served over the openai path, whatever backend says (what the records' settings say)
        cfg = dataclasses.replace(cfg, backend="openai")
    specs = _selected(cfg)
    if not specs:
        log.warning("regenerate: no dataset in %s has regenerate: true; nothing to do", cfg.manifest)
    results = asyncio.run(_run_all(cfg, specs, api_key)) if specs else {}
    replaced = output.completed_outputs(cfg.out)
    manifest = output.write_derived_manifest(cfg.manifest, cfg.out, replaced)
    log.info("regenerate: derived manifest for tokenize: %s", manifest)
    incomplete = output.left_on_source(cfg.manifest, cfg.out, replaced)
    for name, why in incomplete.items():
        log.warning("regenerate: %s keeps dataset %r on its source (%s): tokenize of it trains on the original "
                    "answers, not the target's; regenerate it (eagle3 regenerate --datasets %s) first",
                    manifest, name, why, name)
    return {"manifest": manifest, "datasets": results, "incomplete": incomplete,
            "config": {**asdict(cfg), "extra_body": None}}
