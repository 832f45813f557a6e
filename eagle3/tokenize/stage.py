"""The tokenize stage: one dataset of the manifest -> ``PREP/<name>/`` (see docs/CONTRACTS.md).

Outputs: ``tokenized.parquet``, ``stats.json``, ``rejects.jsonl`` and, written last,
``fingerprint.json``. A dataset whose fingerprint (input content, tokenizer, chat
template, settings, code version) is unchanged is not tokenized again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eagle3 import layout, storage, target
from eagle3.background import BackgroundWriter
from eagle3.datasets import readers
from eagle3.datasets.manifest import FORMATS, check_name, load_manifest, source_extension
from eagle3.datasets.samples import content_id, tokenized_schema
from eagle3.errors import GpuOutOfMemory, InputError
from eagle3.progress import Progress
from eagle3.tokenize.chat_mask import Batch, ChatMasker, TemplateError, ramp_chunk_sizes
from eagle3.tokenize.config import TokenizeConfig

log = logging.getLogger(__name__)

TOKENIZE_VERSION = "1"  # bump when the output for the same inputs changes
TEMPLATE_ERROR = "chat template error"
# fingerprint last: the commit marker. stats.json (with the Parquet's sha256) before the Parquet: a kill between
# them leaves a new checksum beside an old or no tokenized.parquet, which merge refuses or does not see.
FILES = ("rejects.jsonl", layout.PREPARED_STATS, layout.PREPARED_PARQUET, "fingerprint.json")


@dataclass(frozen=True)
class DatasetConfig:
    """Tokenize one dataset (the stage builds one per manifest entry)."""

    name: str
    """Dataset name; the output goes to ``<out>/<name>/``."""
    source: str
    """Input file (local path or ``s3://``): .jsonl, .jsonl.gz or .parquet."""
    format: str
    """``messages`` | ``sharegpt`` | ``tokenized``."""
    tokenizer: str
    """Tokenizer / model directory, ``s3://`` prefix, or the alias ``smollm2-135m-instruct``."""
    out: str
    """The prepared folder (PREP)."""
    category: str | None = None
    """Free text carried into stats.json."""
    max_samples: int | None = None
    """Keep the first N accepted samples; later records are counted as ``over_cap``."""
    max_reject_share: float = 0.05
    """Fail (InputError) when more than this share of the records is refused."""
    batch_size: int = 1024
    """Conversations rendered and encoded per ``encode_batch`` call."""
    force: bool = False
    """Tokenize again even when the fingerprint is unchanged."""

    def __post_init__(self):
        check_name(self.name, "tokenize config name")
        if self.format not in FORMATS:
            raise InputError(f"format {self.format!r} is not known; use one of {', '.join(FORMATS)}")
        if source_extension(self.source) is None:
            raise InputError(f"source {self.source!r} must end with .jsonl, .jsonl.gz or .parquet")
        if not 0.0 <= self.max_reject_share <= 1.0:
            raise InputError(f"max_reject_share {self.max_reject_share!r} must be between 0 and 1, e.g. 0.05")
        if self.max_samples is not None and self.max_samples < 1:
            raise InputError(f"max_samples {self.max_samples!r} must be a positive integer")
        if self.batch_size < 1:
            raise InputError(f"batch_size {self.batch_size!r} must be positive")

    @classmethod
    def for_dataset(cls, spec, tokenizer: str, out: str, **settings: Any) -> "DatasetConfig":
        """Config for a manifest entry (``eagle3.datasets.manifest.DatasetSpec``)."""
        return cls(name=spec.name, source=spec.source, format=spec.format, category=spec.category,
                   max_samples=spec.max_samples, tokenizer=tokenizer, out=out, **settings)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(tok_dir: str):
    from transformers import AutoTokenizer

    if Path(tok_dir).is_dir() and not any((Path(tok_dir) / f).exists() for f in target.TOKENIZER_LOADABLE):
        raise InputError(f"no tokenizer here (none of {', '.join(target.TOKENIZER_LOADABLE)}): pass the target's "
                         "Hugging Face folder, which holds its tokenizer beside config.json", file=tok_dir)
    return AutoTokenizer.from_pretrained(tok_dir)


def _vocab_size(tok_dir: str, pre_tokenized: bool) -> int:
    """V, the bound for token ids: the target's lm_head rows (``target.vocab_size``), never
    ``len(tokenizer)``. For chat data the tokenizer must fit in it (ids it emits index lm_head
    rows); pre-tokenized data needs no tokenizer, so ingesting seed-format JSONL never imports
    transformers."""
    size = target.vocab_size(tok_dir)
    if not pre_tokenized:
        n = len(_load_tokenizer(tok_dir))
        if n > size:
            raise InputError(f"the tokenizer of {tok_dir} has {n} tokens but config.json vocab_size (the lm_head "
                             f"rows) is {size}: ids >= {size} would have no row; use the target's own tokenizer")
    return size


@functools.lru_cache(maxsize=4)
def _masker(tok_dir: str) -> ChatMasker:
    return ChatMasker(_load_tokenizer(tok_dir))


def _chat_template_text(tok_dir: str) -> str:
    """The chat template as stored, read without loading the tokenizer (cheap fingerprint)."""
    jinja = Path(tok_dir, "chat_template.jinja")
    if jinja.exists():
        return jinja.read_text()
    cfg = Path(tok_dir, "tokenizer_config.json")
    template = json.loads(cfg.read_text()).get("chat_template") if cfg.exists() else None
    return template if isinstance(template, str) else json.dumps(template)


def fingerprint_inputs(cfg: DatasetConfig, input_sha256: str, tok_dir: str) -> dict[str, Any]:
    template = _chat_template_text(tok_dir)
    return {
        "input_sha256": input_sha256,
        "tokenizer_fingerprint": target.tokenizer_fingerprint(tok_dir),
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        "settings": {"name": cfg.name, "format": cfg.format, "max_samples": cfg.max_samples},
        "tokenize_version": TOKENIZE_VERSION,
    }


class _ParquetOut:
    """Streams batches into tokenized.parquet (one row group per batch)."""

    def __init__(self, path: Path, source: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.source = pa, source
        self.schema = tokenized_schema()
        # Dictionary pages only for the repeated `source`: on token-id lists they cost write and read time.
        self.writer = pq.ParquetWriter(path, self.schema, compression="zstd", use_dictionary=["source"])
        self.samples = self.tokens = self.loss_tokens = 0

    def write(self, batch: Batch) -> None:
        pa, off = self.pa, batch.offsets
        n = len(off) - 1
        if n == 0:
            return
        lengths = np.diff(off).astype(np.int32)
        loss = np.add.reduceat(batch.loss_mask.astype(np.int32), off[:-1]) if len(batch.loss_mask) else lengths
        ids = [content_id(batch.input_ids[off[k]:off[k + 1]], batch.loss_mask[off[k]:off[k + 1]]) for k in range(n)]
        offsets = pa.array(off.astype(np.int32))
        table = pa.Table.from_arrays([
            pa.array(ids, pa.string()),
            pa.ListArray.from_arrays(offsets, pa.array(batch.input_ids, pa.int32())),
            pa.ListArray.from_arrays(offsets, pa.array(batch.loss_mask, pa.uint8())),
            pa.array(lengths, pa.int32()), pa.array(loss.astype(np.int32), pa.int32()),
            pa.array([self.source] * n, pa.string()),
        ], schema=self.schema)
        self.writer.write_table(table)
        self.samples += n
        self.tokens += int(off[-1])
        self.loss_tokens += int(loss.sum())
        storage.kill_point("tokenize:batch")

    def close(self) -> None:
        self.writer.close()


def _concat(records: list[readers.TokenRecord]) -> Batch:
    lengths = np.fromiter((len(r.input_ids) for r in records), dtype=np.int64, count=len(records))
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Batch(input_ids=np.concatenate([r.input_ids for r in records]),
                 loss_mask=np.concatenate([r.loss_mask for r in records]), offsets=offsets)


def _tokenize_file(cfg: DatasetConfig, local: str, tok_dir: str, parquet: _ParquetOut,
                   rejects: list[dict]) -> dict[str, Any]:
    """Read, render, encode and write; returns counts and template facts."""
    masker = _masker(tok_dir) if cfg.format != "tokenized" else None
    vocab_size = _vocab_size(tok_dir, pre_tokenized=cfg.format == "tokenized")
    total = readers.count_records(local, display=cfg.source)  # an unreadable file is an InputError naming it
    if cfg.max_samples:
        total = min(total, cfg.max_samples)
    progress = Progress(f"tokenize {cfg.name}", total_samples=total, total_tokens=1, logger=log)
    counts = {"accepted": 0, "over_cap": 0}

    def accepted_items():
        """Accepted records in file order; rejects and the cap are counted on the way."""
        for item in readers.read_records(local, cfg.format, display=cfg.source, vocab_size=vocab_size):
            if cfg.max_samples and counts["accepted"] >= cfg.max_samples:
                counts["over_cap"] += 1
            elif isinstance(item, readers.Rejected):
                rejects.append({"file": cfg.source, "line": item.line, "reason": item.reason, "detail": item.detail})
            else:
                yield item

    def chunks():
        """(texts, spans) chunks of up to batch_size conversations: rendered here while the last chunk encodes."""
        texts, spans = [], []
        sizes = ramp_chunk_sizes(cfg.batch_size)
        size = next(sizes)
        for conv in accepted_items():
            try:
                text, sample_spans = masker.render(conv)
            except TemplateError as e:
                rejects.append({"file": cfg.source, "line": conv.line, "reason": TEMPLATE_ERROR,
                                "detail": str(e)[:300]})
                continue
            counts["accepted"] += 1
            texts.append(text)
            spans.append(sample_spans)
            if len(texts) >= size:
                yield texts, spans
                texts, spans = [], []
                size = next(sizes)
        if texts:
            yield texts, spans

    def token_batches():
        records: list[readers.TokenRecord] = []
        for rec in accepted_items():
            counts["accepted"] += 1
            records.append(rec)
            if len(records) >= cfg.batch_size:
                yield _concat(records)
                records = []
        if records:
            yield _concat(records)

    batches = masker.encode_pipelined(chunks()) if masker is not None else token_batches()
    with BackgroundWriter(parquet.write, name="tokenize-parquet") as background:
        for batch in batches:
            background.put(batch)  # ids hashing and Parquet encoding overlap the next batch
            # The token total is estimated from the tokens per sample seen so far, so the ETA means something.
            samples, tokens = progress.samples + len(batch.offsets) - 1, progress.tokens + int(batch.offsets[-1])
            progress.total_tokens = max(int(tokens / max(samples, 1) * total), tokens, 1)
            progress.update(samples=len(batch.offsets) - 1, tokens=int(batch.offsets[-1]))
    progress.finish()
    facts: dict[str, Any] = {"over_cap": counts["over_cap"], "vocab_size": vocab_size}
    if masker is not None:
        info = masker.info
        facts["template"] = {
            "assistant_header": info.assistant_header, "end_of_turn": info.end_of_turn,
            "rewritten_hermes_style": [k for k, ok in (("tools", info.renders_tools),
                                                       ("tool_calls", info.renders_tool_calls),
                                                       ("reasoning_content", info.renders_reasoning),
                                                       ("tool_messages", info.renders_tool_role)) if not ok],
        }
    return facts


def check_tokenized(out_dir: str, stats: dict | None = None) -> str:
    """The local path of ``out_dir``/tokenized.parquet after checking it against the sha256 its stats.json
    records; InputError naming the file and the repair when it differs (files written before the checksum
    was recorded pass unchecked)."""
    path = storage.join(out_dir, layout.PREPARED_PARQUET)
    if stats is None:
        stats_uri = storage.join(out_dir, layout.PREPARED_STATS)
        stats = storage.read_json(stats_uri) if storage.exists(stats_uri) else {}
    return storage.check_sha256(path, stats.get("tokenized_sha256"),
                                f"re-run `eagle3 tokenize` for dataset {stats.get('dataset')!r} (it re-tokenizes a "
                                "dataset whose file fails its checksum)", recorded_in=layout.PREPARED_STATS)


def _intact(out_dir: str, stats_uri: str) -> bool:
    """Whether a finished dataset's tokenized.parquet still matches its checksum (else it is tokenized again)."""
    try:
        check_tokenized(out_dir, storage.read_json(stats_uri))
        return True
    except InputError as e:
        log.warning("tokenize: %s", e)
        return False


def _publish(tmp: Path, out_dir: str, names: tuple[str, ...]) -> None:
    for name in names:
        if (tmp / name).exists():
            storage.publish_file(tmp / name, storage.join(out_dir, name))
            storage.kill_point(f"tokenize:published:{name}")


def _summary(stats: dict[str, Any], out_dir: str) -> dict[str, Any]:
    keys = ("dataset", "samples", "tokens", "loss_tokens", "rejected", "reused", "fingerprint", "seconds")
    return {"out_dir": out_dir, **{k: stats[k] for k in keys}}


def tokenize_dataset(cfg: DatasetConfig) -> dict[str, Any]:
    """Tokenize one dataset into ``<out>/<name>/``; returns a small JSON-able summary."""
    start = time.monotonic()
    out_dir = storage.join(cfg.out, cfg.name)
    if not storage.exists(cfg.source):
        raise InputError("source file does not exist; check the manifest's source path", file=cfg.source)
    local = storage.local_path(cfg.source)
    tok_dir = target.resolve_tokenizer(cfg.tokenizer)
    fp_inputs = fingerprint_inputs(cfg, storage.sha256_file(local), tok_dir)
    fingerprint = hashlib.sha256(json.dumps(fp_inputs, sort_keys=True).encode()).hexdigest()[:32]

    fp_uri, stats_uri = storage.join(out_dir, "fingerprint.json"), storage.join(out_dir, layout.PREPARED_STATS)
    storage.sweep_tmp(out_dir)  # staging folders of killed runs (never a live run's)
    if not cfg.force and storage.exists(fp_uri) and storage.exists(storage.join(out_dir, layout.PREPARED_PARQUET)):
        try:
            old = storage.read_json(fp_uri)
        except ValueError as e:  # a damaged cache marker only means: tokenize again
            log.warning("tokenize %s: %s; tokenizing again", cfg.name, e)
            old = {}
        if (isinstance(old, dict) and old.get("fingerprint") == fingerprint and storage.exists(stats_uri)
                and _intact(out_dir, stats_uri)):
            stats = {**storage.read_json(stats_uri), "reused": True,
                     "seconds": round(time.monotonic() - start, 3)}
            if stats.get("reject_share", 0.0) > cfg.max_reject_share:  # the threshold is not in the fingerprint
                raise InputError(f"dataset {cfg.name!r}: {stats['reject_share']:.1%} of records were refused, above "
                                 f"max_reject_share {cfg.max_reject_share:.1%}; see "
                                 f"{storage.join(out_dir, 'rejects.jsonl')}", file=cfg.source)
            storage.write_json(stats_uri, stats)
            log.info("tokenize %s: unchanged (fingerprint %s), reusing %s", cfg.name, fingerprint[:12], out_dir)
            return _summary(stats, out_dir)

    staging_parent = None if storage.is_s3(out_dir) else out_dir
    if staging_parent:
        Path(staging_parent).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=storage.tmp_prefix("tokenize"), suffix=storage.TMP_SUFFIX,
                                dir=staging_parent))
    try:
        rejects: list[dict] = []
        parquet = _ParquetOut(tmp / layout.PREPARED_PARQUET, cfg.name)
        try:
            facts = _tokenize_file(cfg, local, tok_dir, parquet, rejects)
        finally:
            parquet.close()
        # ASCII JSON: a refused line may hold U+2028 or a lone surrogate, which must not split or break a line.
        (tmp / "rejects.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rejects))
        considered = parquet.samples + len(rejects)
        reasons = Counter(r["reason"] for r in rejects)
        share = len(rejects) / considered if considered else 1.0
        if parquet.samples == 0 or share > cfg.max_reject_share:
            _publish(tmp, out_dir, ("rejects.jsonl",))
            top = ", ".join(f"{reason}: {n}" for reason, n in reasons.most_common(3)) or "none"
            first = rejects[0].get("detail", "") if rejects else ""
            fix = (f"no record was accepted: check that the manifest's format ({cfg.format!r}) is the file's "
                   f"(line {rejects[0].get('line')}: {first})" if parquet.samples == 0 and rejects else
                   "fix the input or raise --max-reject-share")
            raise InputError(
                f"dataset {cfg.name!r}: {len(rejects)} of {considered} records refused ({share:.1%}), above "
                f"max_reject_share {cfg.max_reject_share:.1%}; top reasons: {top}. Each is listed with its line in "
                f"{storage.join(out_dir, 'rejects.jsonl')}; {fix}", file=cfg.source)
        stats = {
            "dataset": cfg.name, "source_uri": cfg.source, "format": cfg.format, "category": cfg.category,
            "samples": parquet.samples, "tokens": parquet.tokens, "loss_tokens": parquet.loss_tokens,
            "rejected": len(rejects), "reject_share": round(share, 6), "reject_reasons": dict(reasons),
            "max_samples": cfg.max_samples, **facts,
            "fingerprint": fingerprint, "tokenizer_fingerprint": fp_inputs["tokenizer_fingerprint"],
            "seconds": round(time.monotonic() - start, 3), "reused": False,
            "tokenized_sha256": storage.sha256_file(tmp / layout.PREPARED_PARQUET),  # checked by every reader
        }
        (tmp / layout.PREPARED_STATS).write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
        (tmp / "fingerprint.json").write_text(
            json.dumps({"fingerprint": fingerprint, "inputs": fp_inputs}, indent=2, sort_keys=True) + "\n")
        if storage.exists(fp_uri):  # an interrupted publish must not look complete
            storage.delete(fp_uri)
        _publish(tmp, out_dir, FILES)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("tokenize %s: %d samples, %d tokens (%d loss), %d rejected, %.1fs", cfg.name, stats["samples"],
             stats["tokens"], stats["loss_tokens"], stats["rejected"], stats["seconds"])
    if stats["rejected"]:  # under the threshold, but each one is a sample the draft will not see
        log.warning("tokenize %s: %d record(s) refused (%s), each listed with its line in %s", cfg.name,
                    stats["rejected"], ", ".join(f"{r}: {n}" for r, n in reasons.most_common(3)),
                    storage.join(out_dir, "rejects.jsonl"))
    return _summary(stats, out_dir)


def _find_spec(manifest: str, dataset: str):
    specs = load_manifest(manifest, check_sources=False)  # only this dataset's source is read (and checked)
    for spec in specs:
        if spec.name == dataset:
            return spec
    raise InputError(f"dataset {dataset!r} is not in {manifest}; its datasets are: {', '.join(s.name for s in specs)}")


class TokenizeFailed(RuntimeError):
    """Datasets failed for a reason other than their input (a bug, storage, the machine).

    Not an Eagle3Error on purpose: the CLI exits 1 with the traceback, not 2 (bad input).
    ``failures`` maps each failed dataset's name to its error, InputErrors included."""

    def __init__(self, message: str, failures: dict[str, BaseException]):
        super().__init__(message)
        self.failures = failures


_OUT_OF_MEMORY = (GpuOutOfMemory, MemoryError)


def run(cfg: TokenizeConfig) -> dict[str, Any]:
    """Tokenize every dataset of the manifest (or only ``cfg.dataset``); ``{"datasets": {name: summary}}``.

    ``cfg.source_override`` replaces that dataset's source with a regenerated file (format ``messages``,
    as ``eagle3 regenerate`` writes it). One dataset's failure never skips the others; each is logged
    with the dataset's name.
    At the end, if any failed:

    - all failures InputErrors (bad input, never retried): one InputError lists them;
    - any other error (maybe a bug): TokenizeFailed lists every failure, chained to the first
      unexpected error. It is not dressed up as an InputError, so it is not taken for bad input.

    Out-of-memory errors (GpuOutOfMemory, MemoryError) are raised at once, unchanged: they are
    the class a retry is for, and the retry reuses the datasets already done (fingerprints).
    """
    if cfg.dataset is not None:
        specs = [_find_spec(cfg.manifest, cfg.dataset)]
        if cfg.source_override:
            specs = [dataclasses.replace(specs[0], source=cfg.source_override, format="messages")]
    else:
        specs = load_manifest(cfg.manifest)
    settings = {"max_reject_share": cfg.max_reject_share, "batch_size": cfg.batch_size, "force": cfg.force}
    results: dict[str, dict[str, Any]] = {}
    failures: dict[str, BaseException] = {}
    for spec in specs:
        try:
            results[spec.name] = tokenize_dataset(DatasetConfig.for_dataset(spec, cfg.model, cfg.out, **settings))
        except _OUT_OF_MEMORY:
            raise
        except InputError as e:
            log.error("tokenize %s failed: %s", spec.name, e)
            failures[spec.name] = e
        except Exception as e:  # noqa: BLE001 - reported below, after the other datasets ran
            log.exception("tokenize %s failed with an unexpected %s (a bug?)", spec.name, type(e).__name__)
            failures[spec.name] = e
    if not failures:
        return {"datasets": results}
    lines = "\n  ".join(f"{name}: {'' if isinstance(e, InputError) else type(e).__name__ + ': '}{e}"
                        for name, e in failures.items())
    message = f"{len(failures)} of {len(specs)} dataset(s) failed:\n  {lines}"
    unexpected = [e for e in failures.values() if not isinstance(e, InputError)]
    if unexpected:
        raise TokenizeFailed(message, failures) from unexpected[0]
    raise InputError(message)
