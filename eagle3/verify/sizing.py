"""The gate's memory and engine checks (eagle3/memory.py's model), and extraction hours per engine.

  memory       the target fits the extraction engine asked for (transformers: one device; vllm or sglang: the
               server's tensor x pipeline ranks), and a training micro-batch of the longest sample fits one device; picks the
               training token budget: the largest that fits, capped by VerifyConfig.train_token_budget
  engine hours extraction hours per engine from the rates earlier runs measured (eagle3/rates.py), the
               VerifyConfig.tokens_per_s parameter where none was measured

A failure names the setting to change. Without a target (no ``model``) nothing is sized. The device is the one
given (device_memory_gib), else the one measured here; where the training and extraction tasks run on other
workers (devices_elsewhere) and no GPU is here, nothing is sized either: the memory check fails, naming the
settings that give it.
"""

from __future__ import annotations

import logging
import os

from eagle3 import memory, rates, storage_options
from eagle3.memory import gib
from eagle3.verify.config import VerifyConfig

log = logging.getLogger(__name__)


def _check(name: str, passed: bool, detail: str, **numbers) -> dict:
    return {"name": name, "passed": bool(passed), "detail": detail, **numbers}


def train_precision(cfg: VerifyConfig, kind: str) -> str:
    """The training precision to size for: what eagle3.devices.resolve_precision picks for train on ``kind`` (the
    asked one, else $EAGLE3_PRECISION, else by the CUDA capability or by the CPU's flags and probe). A device
    known by its memory alone (``given``: the GPUs are on other workers) is taken for sm80 or later: bf16."""
    from eagle3.devices import PRECISION_ENV, resolve_precision

    if kind == "given" and cfg.precision == "auto" and os.environ.get(PRECISION_ENV, "auto").strip() in ("", "auto"):
        return "bfloat16"
    return resolve_precision(cfg.precision, "cuda" if kind == "given" else kind).name


def engine_hours(cfg: VerifyConfig, tokens: int) -> dict:
    """{engine: {"tokens_per_s", "source", "hours"}} for every engine measured before, and the one asked for."""
    seen = rates.measured(cfg.store or cfg.merged, cfg.model)
    out = {}
    for engine in sorted(set(seen) | {cfg.target_engine}):
        m = seen.get(engine)
        if m:  # one task's rate x the tasks the last run ran side by side
            rate, source = m["tokens_per_s"] * m["tasks"], (f"measured: {m['tokens']} tokens in {m['seconds']:.0f} "
                                                             f"forward-s over {m['tasks']} task(s)")
        else:
            rate, source = cfg.tokens_per_s, "parameter tokens_per_s (no earlier run measured this engine)"
        out[engine] = {"tokens_per_s": rate, "source": source, "hours": tokens / rate / 3600}
    return out


def memory_check(cfg: VerifyConfig, longest: int, max_seq_len: int, online: bool) -> dict:
    """The `memory` check; its ``train_token_budget`` is the budget train is given."""
    if not cfg.model:
        return _check("memory", True, "not sized: no target model given", train_token_budget=cfg.train_token_budget)
    from eagle3.target import read_config

    config = read_config(cfg.model)
    mem, kind = memory.device_memory(cfg.device_memory_gib or None)
    if kind == "cpu" and cfg.devices_elsewhere:  # this worker's RAM says nothing of the GPUs
        return _check("memory", False, (
            f"not sized: the training and extraction devices are on other workers (the gpu queue), and this one "
            f"has no GPU to measure ({gib(mem)} of RAM is not their memory); give one device's memory: the Param "
            f"device_memory_gib, or {memory.GPU_MEMORY_ENV} in the deployment's environment (its default)"),
            train_token_budget=cfg.train_token_budget, device_memory=mem, device=kind)
    precision = train_precision(cfg, kind)
    kind = "cuda" if kind == "given" else kind
    usable = memory.USABLE_SHARE * mem
    stored = memory.checkpoint_bytes(cfg.model)
    problems, notes = [], []
    topk = storage_options.option(cfg.storage_option).target == "topk"

    # Extraction, and online training: with target_engine=transformers its target is a forward inside the
    # trainer (colocated, so it shares the device); with vllm or sglang it is a server on devices of its own.
    colocated = online and cfg.target_engine == "transformers"
    engine = cfg.target_engine
    ext = memory.extraction_peak(config, cfg.extract_token_budget, engine, cfg.tensor_parallel_size,
                                 precision=precision if engine == "transformers" else None, topk_logits=topk,
                                 max_seq_len=max_seq_len, stored=stored)
    w = ext["weights"]
    if ext["bytes"] > usable:
        tp = memory.min_tensor_parallel(config, mem, cfg.extract_token_budget, max_seq_len, topk, stored=stored)
        fix = (f"target_tensor_parallel_size={tp} splits it over {tp} devices" if tp else
               "no tensor parallel size up to 64 fits: add pipeline parallelism or a quantized checkpoint")
        if engine == "transformers":
            where = "training_mode=online runs it inside training" if colocated else "target_engine=transformers"
            problems.append(
                f"{where}: the target ({w['params'] / 1e9:.1f}B params, {w['dtype']}) needs {gib(ext['bytes'])} on "
                f"one device ({gib(w['bytes'])} of weights) but a device has {gib(mem)} ({kind}); use "
                f"target_engine=vllm with tensor parallelism ({fix}), or target_engine=sglang the same way "
                "(storage_option fp8-topk only; untested against a real SGLang)"
                + (" (online training then reads it from the server)" if colocated else ""))
        else:
            problems.append(f"target_engine={engine} with target_tensor_parallel_size={cfg.tensor_parallel_size}: "
                            f"{gib(ext['bytes'])} per device > {gib(usable)} usable of {gib(mem)}; {fix}")
    notes.append(f"extraction ({engine}, tp {ext['ranks']}): {gib(ext['bytes'])} per device "
                 f"({gib(w['bytes'])} weights, {w['dtype']}, from {w['source']})")

    # Training: the largest micro-batch that fits, capped by the Param; one longest sample must fit.
    shape = memory.DraftShape.from_target(config, cfg.draft_vocab_size)
    reserved = ext["bytes"] - memory.RUNTIME_BYTES["cuda"] if colocated else 0
    args = dict(ttt_length=cfg.ttt_length, precision=precision, soft_labels=not topk, device=kind)
    # Sequence parallel: a device holds 1/split of each micro-batch's positions (eagle3/draft/sequence.py).
    split = cfg.train_processes if cfg.sequence_parallel else 1
    args["seq_parallel"] = split
    fits = memory.largest_budget(shape, mem, checkpoint_steps=cfg.checkpoint_ttt_steps, reserved=reserved, **args)
    budget = min(fits, cfg.train_token_budget)
    need = memory.training_peak(shape, longest, checkpoint_steps=cfg.checkpoint_ttt_steps, **args)
    if fits < longest:
        with_ckpt = memory.largest_budget(shape, mem, checkpoint_steps=True, reserved=reserved, **args)
        fix = (f"set checkpoint_ttt_steps (then samples up to {with_ckpt} tokens fit)"
               if not cfg.checkpoint_ttt_steps and with_ckpt >= longest else
               f"lower max_seq_len (now {max_seq_len}) to {max(fits, 0)} or less"
               + ("" if cfg.checkpoint_ttt_steps else f" ({with_ckpt} with checkpoint_ttt_steps)")
               + (", or set sequence_parallel (it splits each sample over the train task's processes)"
                  if split == 1 else "")
               + ", or lower ttt_length / draft_vocab_size, or train on a device with more memory")
        problems.append(f"training: one sample of {longest} tokens (the longest; max_seq_len {max_seq_len}) needs "
                        f"{gib(need['bytes'] + reserved)} per device"
                        f"{f' (split over {split} processes)' if split > 1 else ''} but {gib(usable)} of the "
                        f"device's {gib(mem)} is usable (TTT {cfg.ttt_length}, Vd {cfg.draft_vocab_size}, "
                        f"{precision}); {fix}")
    per_device = -(-budget // split)
    notes.append(f"training: {budget} tokens per micro-batch ({'capped by train_token_budget' if budget < fits else 'the most that fits'}"
                 f"; {fits} fit{f', {per_device} per device over {split} sequence-parallel processes' if split > 1 else ''}), "
                 f"{gib(memory.training_peak(shape, budget, checkpoint_steps=cfg.checkpoint_ttt_steps, **args)['bytes'] + reserved)} "
                 f"predicted of {gib(mem)} ({kind}, {precision}, TTT {cfg.ttt_length}, Vd {cfg.draft_vocab_size}"
                 f"{', checkpointed steps' if cfg.checkpoint_ttt_steps else ''})"
                 + (f"; samples longer than {budget} train alone (up to {longest}, which fits)" if budget < longest else ""))
    detail = "; ".join(problems) if problems else "; ".join(notes)
    return _check("memory", not problems, detail, train_token_budget=max(budget, 0), fits_token_budget=fits,
                  device_memory=mem, device=kind, precision=precision, longest_sample=longest,
                  extraction=ext, training=need)
