"""The extract stage: run the target over the merged dataset and fill the hidden-state store.

One call handles one task (``shard="I/N"``): it takes its 1/N of the samples,
skips every sample id any index of the store already lists (incremental, and
resume after a crash), plans shards and batches deterministically
(:mod:`eagle3.extract.plan`: batches over the whole list, so they may cross
shards), prints an estimate of hours and bytes, then extracts batch by batch; a
thread of its own writes each shard as soon as its samples are done (published
atomically, then added to ``index-<task>.json``) while the next batches run.
After an out-of-memory it halves the token budget (never below one sample of
the longest length: eagle3.oom.halved_budget), writes it to
``adapt-<task>.json`` and raises GpuOutOfMemory; the next run starts from that
budget. At its start it re-extracts its own missing or damaged
shards in place, and drops other tasks' ones that hold its samples from their
indexes (those samples are then extracted again). The forward is ``engine``'s:
transformers in this process (eagle3.extract.capture), or a vLLM or SGLang
server the task starts and stops (eagle3.extract.served); everything else is the
same for all of them.
"""

from __future__ import annotations

import collections
import logging
import os
import time

from eagle3 import layout
from eagle3 import storage as st
from eagle3 import storage_options
from eagle3.extract.config import SERVED_ENGINES, ExtractConfig
from eagle3.errors import GpuOutOfMemory, InputError
from eagle3.extract import codec
from eagle3.extract.plan import (Plan, Sample, ShardPlan, batch_carry, cut_batches, in_task, order, padding_share,
                                 parse_shard, plan_task, recorded_batches, sort_key, task_name)

log = logging.getLogger(__name__)

SLOW_SHARD_ENV = "EAGLE3_EXTRACT_SLOW_SHARD_S"  # test hook: sleep before publishing each shard


class MergedTokens:
    """The token columns of train.parquet as flat numpy arrays (4 + 1 bytes per token, no Python lists)."""

    def __init__(self, input_ids, loss_mask, offsets):
        self.input_ids, self.loss_mask, self.offsets = input_ids, loss_mask, offsets

    def row(self, i: int):
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.input_ids[a:b], self.loss_mask[a:b]


def read_merged(uri: str) -> tuple[list[Sample], MergedTokens]:
    """Samples of MERGED/train.parquet (columns id, input_ids, loss_mask), duplicate ids dropped."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = uri if uri.endswith(".parquet") else st.join(uri, layout.MERGED_PARQUET)
    if not st.exists(path):
        raise InputError(f"merged dataset {path} not found; run `eagle3 merge --out {uri}` first")
    from eagle3.merge.stage import checked_train_parquet

    table = pq.read_table(checked_train_parquet(path), columns=["id", "input_ids", "loss_mask"])
    ids_col = table.column("input_ids").combine_chunks()
    mask_col = table.column("loss_mask").combine_chunks()
    offsets = ids_col.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(offsets)
    bad = np.flatnonzero((np.diff(mask_col.offsets.to_numpy()) != lengths) | (lengths <= 0))
    sample_ids = table.column("id").to_pylist()
    if bad.size:
        i = int(bad[0])
        raise InputError(f"row {i} (id {sample_ids[i]}): {lengths[i]} input_ids vs "
                         f"{len(mask_col[i])} loss_mask entries (must be equal and > 0); re-run merge", file=path)
    # flatten() honours slicing (unlike .values); copies make the arrays writable, as torch wants them
    tokens = MergedTokens(np.array(ids_col.flatten().cast(pa.int32()).to_numpy()),
                          np.array(mask_col.flatten().cast(pa.uint8()).to_numpy()), offsets - offsets[0])
    seen, out = set(), []
    for row, (sid, n) in enumerate(zip(sample_ids, lengths.tolist())):
        if sid not in seen:
            seen.add(sid)
            out.append(Sample(sid, n, row))
    return out, tokens


def _stored(writer, by_id: dict[str, Sample]) -> tuple[list, dict[str, int]]:
    """This task's stored samples in stored order (its shards by number; None for a sample no longer in the
    dataset), and where each shard's samples start in that list."""
    from eagle3.extract.store_format import shard_seq

    stored, starts = [], {}
    for name in sorted(writer.index(), key=shard_seq):
        starts[name] = len(stored)
        stored += [by_id.get(i) for i in writer.index()[name]["sample_ids"]]
    return stored, starts


def _repair_plan(writer, by_id: dict[str, Sample], budget: int) -> list[Plan]:
    """A plan for each of this task's shards whose file is missing or damaged, re-extracting it under its own
    name: its samples in the batches its index entry records (with the neighbours those batches held,
    forwarded again and not stored), so the same bytes; where a neighbour is gone or a batch exceeds the
    budget (halved after an out-of-memory), its samples cut anew. A bad shard whose samples are no longer all
    in the merged dataset is dropped instead; its samples that are get extracted anew."""
    from eagle3.extract.store import corrupted_shards

    bad = corrupted_shards(writer.uri, writer.index(), use_marks=True, by_size=True)
    stored, starts = _stored(writer, by_id)
    plans = []
    for name, why in bad.items():
        entry = writer.index()[name]
        log.warning("extract: %s/%s is corrupted (%s); extracting it again", writer.uri, name, why)
        own = [by_id.get(i) for i in entry["sample_ids"]]
        if None in own:
            writer.drop_shard(name)
            continue
        batches = recorded_batches(stored, starts[name], entry)
        if batches is None or any(len(b) > 1 and len(b) * max(lengths_of(b)) > budget for b in batches):
            batches = cut_batches(order(own), budget)
        if entry.get("batch_sizes"):  # the plan's batches stay on record (a later resume continues them)
            shard = ShardPlan(own, tuple(entry["batch_sizes"]), int(entry.get("batch_offset", 0)), name)
        else:
            shard = ShardPlan(own, tuple(len(b) for b in batches), 0, name)
        plans.append(Plan(batches, [shard]))
    return plans


def _carried(writer, by_id: dict[str, Sample], todo: list[Sample]) -> list[Sample]:
    """The stored samples that open the batch a killed run was in when it wrote its last shard: a resumed run
    forwards them again (and stores nothing of them), so that batch and every later one are the uninterrupted
    run's (eagle3.extract.plan, cut_batches is suffix-stable). Empty when the last shard ended a batch, or the
    remaining samples are not what that run left (another dataset, another task's samples)."""
    if not todo or not writer.index():
        return []
    from eagle3.extract.store_format import shard_seq

    n = batch_carry(writer.index()[max(writer.index(), key=shard_seq)])
    stored, _ = _stored(writer, by_id)
    carried = stored[len(stored) - n:] if 0 < n <= len(stored) else []
    if None in carried or order(carried) != carried or (carried and sort_key(carried[-1]) >= sort_key(todo[0])):
        return []
    return carried


def run(cfg: ExtractConfig) -> dict:
    """Run one extraction task; returns a JSON-able summary."""
    from eagle3.devices import lease_device, resolve_device

    device = resolve_device(cfg.device)
    # "cuda" leases free GPUs (one, or a served engine's parallel sizes' product); an explicit "cuda:N" is the
    # caller's choice and takes no lease. the server inherits the lease's CUDA_VISIBLE_DEVICES.
    with lease_device(cfg.gpus() if device == "cuda" else 0, root=cfg.lease_root) as leased:
        if device == "cuda" and leased != "cpu":
            import torch

            # A process that already set up CUDA keeps its device list; a fresh one sees only the lease.
            device = f"cuda:{leased[0]}" if torch.cuda.is_initialized() else "cuda:0"
        return _extract_on(cfg, device)


def _extract_on(cfg: ExtractConfig, device: str) -> dict:
    start = time.monotonic()
    index, count = parse_shard(cfg.shard)
    task = task_name(index, count)
    merged, tokens = read_merged(cfg.merged)
    mine = [s for s in merged if in_task(s.id, index, count)]
    if cfg.engine in SERVED_ENGINES:  # a server this task starts (eagle3.extract.served); stopped on every exit
        from eagle3.extract.served import served_capture

        with served_capture(cfg, device, max((s.num_tokens for s in mine), default=1)) as cap:
            return _extract_with(cfg, device, cap, cap.engine, start, task, mine, tokens)
    from eagle3.extract.capture import TargetCapture

    cap = TargetCapture(cfg.model, device, list(cfg.aux_layers) if cfg.aux_layers else None,
                        lean=cfg.lean_forward, precision=cfg.precision)
    return _extract_with(cfg, device, cap, transformers_engine(), start, task, mine, tokens)


def transformers_engine() -> dict:
    """What the store records for the in-process forward (``engine`` in store.json and the index)."""
    import transformers

    return {"name": "transformers", "version": transformers.__version__}


def _extract_with(cfg: ExtractConfig, device: str, cap, engine: dict, start: float, task: str,
                  mine: list[Sample], tokens: MergedTokens) -> dict:
    """The task's work once its target is ready: ``cap`` runs the forward (TargetCapture or a ServedCapture)."""
    from eagle3.background import BackgroundWriter
    from eagle3.errors import is_oom
    from eagle3.oom import halved_budget
    from eagle3.extract.store import StoreWriter
    from eagle3.progress import Progress
    from eagle3.target import model_fingerprint, resolve_model

    writer = StoreWriter(cfg.out, model_fp=model_fingerprint(resolve_model(cfg.model)), model_name=cfg.model,
                         aux_layers=cap.aux_layers, hidden_size=cap.hidden_size, vocab_size=cap.vocab_size,
                         storage_option=cfg.storage_option, task=task, precision=cap.precision.to_dict(),
                         engine=engine).open()
    st.sweep_tmp(writer.uri)  # leftovers of killed runs (never a live task's)
    budget, here = cfg.token_budget, device_identity(device)
    if st.exists(writer.adapt_path()):
        adapt = st.read_json(writer.adapt_path())
        adapted = int(adapt["token_budget"])
        # An OOM's halving holds for the budget asked and the device it ran out on; another device (a retry on
        # a larger GPU) or another asked budget (the user's own choice) starts from what is asked.
        same = adapt.get("asked", budget) == budget and adapt.get("device", here) == here
        if adapted < budget and same:
            log.info("token budget %d from %s (after an out-of-memory), not %d", adapted, writer.adapt_path(), budget)
            budget = adapted
        elif adapted < budget:
            log.info("%s halved budget %s to %d on %s; this task asks %d on %s: taken as asked",
                     writer.adapt_path(), adapt.get("asked"), adapted, adapt.get("device"), budget, here)
    # another task's bad shard is not this task's to rewrite, but its samples of this task are
    dropped = writer.drop_bad_shards_of_others(s.id for s in mine)
    by_id = {s.id: s for s in mine}
    repairs = _repair_plan(writer, by_id, budget)
    done = writer.done_ids()  # a repaired shard's samples too: they are rewritten in place, not added
    todo = order([s for s in mine if s.id not in done])
    repaired = sum(len(sh.samples) for p in repairs for sh in p.shards)
    bpt = storage_options.bytes_per_token(cfg.storage_option, cap.hidden_size)
    shard_tokens = max(1, int(cfg.shard_mb * 2**20) // bpt)
    main = plan_task(todo, budget, shard_tokens, _carried(writer, by_id, todo))
    plans = [*repairs, main]
    batches = [b for p in plans for b in p.batches]
    real, padded = padding_share(batches)  # real: tokens forwarded, a resumed batch's stored samples too
    to_store = sum(s.num_tokens for p in plans for sh in p.shards for s in sh.samples)
    summary = {
        "store": writer.uri, "task": task, "device": device, "storage_option": cfg.storage_option,
        "aux_layers": cap.aux_layers,
        "forward": cap.forward_path, "precision": cap.precision.to_dict(), "engine": engine,
        "samples_in_task": len(mine), "samples_skipped": len(mine) - len(todo) - repaired,
        "samples_extracted": 0,
        "shards_repaired": [sh.name for p in repairs for sh in p.shards], "shards_dropped": sorted(dropped),
        "tokens": 0, "shards_written": 0, "bytes_written": 0, "bytes_per_token": bpt, "token_budget": budget,
        "padding_share": round(1 - real / padded, 4) if padded else 0.0,
    }
    log.info("extract %s: %d samples in this task, %d already stored, %d to do (%d tokens) in %d shards, %d "
             "batches of up to %d padded tokens; padding %.1f%% of %d padded tokens at budget %d; %s forward in "
             "%s (%s)", task, len(mine), summary["samples_skipped"], len(todo), to_store,
             len(main.shards), len(batches), max((len(b) * max(lengths_of(b)) for b in batches), default=0),
             100 * summary["padding_share"], padded, budget, cap.forward_path, cap.precision.name,
             cap.precision.reason)
    if cfg.engine in SERVED_ENGINES and batches:
        cap.start()  # before the clocks of progress and of the first batch: a start is minutes, not throughput
        summary["server_start_s"] = cap.start_s
    longest = max(lengths_of(mine), default=1)  # the OOM policy's floor: one sample of the longest length
    progress = Progress("extract", len(todo) + repaired, to_store, every_s=cfg.progress_every_s, logger=log,
                        kept=summary["samples_skipped"])
    forward_s, estimated = 0.0, False
    # Rate for the estimate: skip the first batch (warm-up, and the shortest samples), then
    # measure at least one budget's worth of tokens.
    n_batches, seen, rate_tokens, rate_s = len(batches), 0, 0, 0.0
    if cfg.tokens_per_s and todo:  # known throughput: estimate before any work
        summary["estimate"] = _estimate(cfg, to_store, len(todo) + repaired, bpt, cfg.tokens_per_s)
        estimated = True
    slow = float(os.environ.get(SLOW_SHARD_ENV, "0") or 0)
    entries = []

    def write(shards: list[tuple[list[dict], ShardPlan]]) -> None:  # on the writer thread
        for items, shard in shards:
            if slow:
                time.sleep(slow)
            entries.append(writer.write_shard(items, shard.name, batch_sizes=shard.batch_sizes,
                                              batch_offset=shard.batch_offset))

    # The shards of a batch are written while the next batches run. One batch's shards wait at most, so the
    # states waiting to be written stay within about two batches or shards, whichever is larger; leaving the
    # block (an error or SIGTERM too) writes what is finished first.
    with BackgroundWriter(write, depth=1, name="extract-writer") as shard_writer:
        for plan in plans:
            keep = {s.id for sh in plan.shards for s in sh.samples}  # the others only rebuild a batch
            shards, pending = collections.deque(plan.shards), []
            # a served engine keeps requests in flight across batches, within two budgets' worth of tokens
            results = cap.forward_batches((([tokens.row(s.row)[0] for s in b], [s.id for s in b])
                                           for b in plan.batches), 2 * budget)
            for batch in plan.batches:
                t0 = time.monotonic()
                try:
                    aux, last, lengths = next(results)
                    feats = codec.encode(cfg.storage_option, aux, last, lm_head=cap.lm_head)
                except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
                    if not is_oom(e):
                        raise
                    halved = halved_budget(budget, longest, "merge with a smaller --max-seq-len, or extract with "
                                           "--engine vllm or sglang and tensor parallelism (docs/extract.md)")
                    _persist_halved_budget(writer.adapt_path(), halved, budget, batch, e, cfg.token_budget, here)
                    raise GpuOutOfMemory(
                        f"out of memory on a batch of {len(batch)}x{max(lengths_of(batch))} tokens at budget "
                        f"{budget}; budget {halved} saved in {writer.adapt_path()}, re-run to resume") from e
                forward_s += time.monotonic() - t0
                new = _items(batch, lengths, feats, keep, tokens)
                pending += new
                if finished := _finished(pending, shards):
                    shard_writer.put(finished)
                pos = sum(lengths)
                seen += 1
                if seen > 1 or n_batches == 1:
                    rate_tokens, rate_s = rate_tokens + pos, rate_s + time.monotonic() - t0
                if not estimated and (rate_tokens >= min(budget, real) or seen == n_batches) and rate_tokens:
                    estimated = True
                    summary["estimate"] = _estimate(cfg, to_store, len(todo) + repaired, bpt,
                                                    rate_tokens / max(rate_s, 1e-9))
                progress.update(len(new), sum(len(i["input_ids"]) for i in new))
                st.kill_point("extract:batch")
            assert not shards and not pending, "a plan's batches hold every sample of its shards"
    summary["shards_written"] = len(entries)
    summary["samples_extracted"] = sum(e["samples"] for e in entries)
    summary["tokens"] = sum(e["tokens"] for e in entries)
    if batches:
        progress.finish()
    else:
        log.info("extract %s: nothing to do, all %d samples are stored", task, len(mine))
    summary["bytes_written"] = summary["tokens"] * bpt
    summary["seconds"] = round(time.monotonic() - start, 3)
    summary["tokens_per_s"] = round(summary["tokens"] / forward_s, 1) if forward_s else None
    from eagle3 import rates  # the next run's gate prices extraction at this engine's measured speed

    rates.record(cfg.out, engine["name"], cfg.model, task, summary["tokens"], forward_s)
    return summary


def _items(batch: list[Sample], lengths: list[int], feats: dict, keep: set[str], tokens: MergedTokens) -> list[dict]:
    """What the store writer takes of a forwarded batch: the samples ``keep`` names (the others were stored
    already and only rebuilt the batch), each with its rows of the encoded features."""
    items, pos = [], 0
    for s, n in zip(batch, lengths):
        if s.id in keep:
            ids, mask = tokens.row(s.row)
            items.append({"id": s.id, "input_ids": _ints(ids), "loss_mask": _bytes(mask),
                          "tensors": {k: v[pos:pos + n] for k, v in feats.items()}})
        pos += n
    return items


def _finished(pending: list[dict], shards: collections.deque) -> list[tuple[list[dict], ShardPlan]]:
    """Take each shard whose samples are all done off the front of ``shards`` and ``pending`` (both in plan
    order), with its samples."""
    out = []
    while shards and len(pending) >= len(shards[0].samples):
        shard = shards.popleft()
        items = pending[:len(shard.samples)]
        del pending[:len(shard.samples)]
        assert [i["id"] for i in items] == [s.id for s in shard.samples], shard.name
        out.append((items, shard))
    return out


def lengths_of(batch: list[Sample]) -> list[int]:
    return [s.num_tokens for s in batch]


def _ints(values):
    import torch

    return torch.as_tensor(values).to(torch.int32)


def _bytes(values):
    import torch

    return torch.as_tensor(values).to(torch.uint8)


def _estimate(cfg: ExtractConfig, tokens: int, samples: int, bpt: int, measured_tok_s: float) -> dict:
    """Hours and bytes for the whole task, logged before the bulk of the work (the seed's
    72 h / 924 GB would have shown up here)."""
    tok_s = cfg.tokens_per_s or measured_tok_s
    est = {"tokens": tokens, "bytes": storage_options.stored_bytes(bpt, tokens, samples), "tokens_per_s": round(tok_s, 1),
           "hours": round(tokens / tok_s / 3600, 3) if tok_s else None,
           "tokens_per_s_source": "parameter" if cfg.tokens_per_s else "first batch"}
    log.info("extract estimate: %d tokens x %d bytes/token = %.2f GB; at %.0f tok/s (%s) about %.2f h",
             tokens, bpt, est["bytes"] / 1e9, tok_s, est["tokens_per_s_source"], est["hours"] or 0)
    free = st.free_bytes(cfg.out)
    if free is not None and est["bytes"] > free:
        raise InputError(f"the store needs about {est['bytes'] / 1e9:.1f} GB but {cfg.out} has "
                         f"{free / 1e9:.1f} GB free; free space, pick a compact --storage-option, or use s3://")
    return est


def _persist_halved_budget(path: str, halved: int, budget: int, batch: list[Sample], err: BaseException,
                           asked: int, device: str) -> None:
    st.write_json(path, {"token_budget": halved, "previous_token_budget": budget, "asked": asked, "device": device,
                         "failed_batch": f"{len(batch)}x{max(lengths_of(batch))}", "error": str(err)[:300]})


def device_identity(device: str) -> str:
    """What an out-of-memory budget is kept for: the GPU's name and memory, or "cpu"."""
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(torch.device(device))
    return f"{props.name} {props.total_memory / 2**30:.0f} GiB"
