"""The evaluate stage on the project's own decoder: real speculative decoding of a draft against its target.

For every prompt the target decodes twice in the same process, on the same
prompt ids: plain greedy with a KV cache (the baseline) and the chain
speculative decoder. Greedy speculation is lossless, so the two outputs must
be equal token for token; a difference is classified by eagle3.evaluate.lossless
(a near-tie that the precision's rounding flips, or a failure), and a failure
fails the stage (GateFailed) after report.json was written, naming the prompt
and the first differing position.
Both decodes run the one target at one precision (EvaluateConfig.precision,
resolved by eagle3.devices.resolve_precision), and report.json names it: bf16
and fp32 greedy outputs differ, so each precision is its own lossless target.
The draft runs in fp32 (it is small; its numbers only move τ, never the output).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from eagle3 import storage
from eagle3.errors import InputError
from eagle3 import acceptance as metrics
from eagle3.evaluate.config import EvaluateConfig

log = logging.getLogger(__name__)


def offline_sim_accept_len(checkpoint: str) -> dict | None:
    """The trainer's last held-out estimate (CKPT/metrics.jsonl), shown beside the measured τ. Read before any
    decoding, so a wrong ``checkpoint`` fails in a second, not after the benchmark."""
    from eagle3.checkpoint import METRICS_FILE, last_eval

    if not storage.exists(storage.join(checkpoint, METRICS_FILE)):
        raise InputError(f"no {METRICS_FILE} here: --checkpoint names the train stage's folder (CKPT), whose "
                         "held-out estimate the report shows beside the measured τ; fix the path or leave it out",
                         file=checkpoint)
    ev = last_eval(checkpoint)
    if ev is None:
        log.warning("no held-out evaluation in %s: the offline simulated acceptance length is left out", checkpoint)
        return None
    return {"sim_accept_len": float(ev["sim_accept_len"]), "step": ev.get("step"), "acc": ev.get("acc_i") or []}


def _load(cfg: EvaluateConfig, device: str, precision: str):
    from eagle3 import target as target_mod
    from eagle3.draft.build import load_target_embedding
    from eagle3.evaluate.spec_decode import Eagle3DraftStepper, TargetRunner
    from eagle3.export import load_exported_draft, trained_aux_layers

    target_dir = target_mod.resolve_model(cfg.model)
    draft_dir = storage.local_dir(cfg.draft)
    draft_cfg_path = storage.join(draft_dir, "config.json")
    if not storage.exists(draft_cfg_path):
        raise InputError(f"--draft {cfg.draft!r} has no config.json; point it at an `eagle3 export` output")
    draft_cfg = storage.read_json(draft_cfg_path)
    aux_layers = trained_aux_layers(draft_cfg, draft_cfg_path)
    tokenizer = target_mod.load_tokenizer(target_dir)
    model = target_mod.load_model(target_dir, device=device, precision=precision)
    vocab_size = target_mod.vocab_size(target_dir)
    if int(draft_cfg.get("vocab_size", -1)) != vocab_size:
        raise InputError(f"{draft_cfg_path}: vocab_size={draft_cfg.get('vocab_size')} but the target "
                         f"{cfg.model!r} has {vocab_size}; was the draft trained for another target?")
    draft = load_exported_draft(draft_dir, load_target_embedding(target_dir)).to(device)
    return tokenizer, model, TargetRunner(model, aux_layers), Eagle3DraftStepper(draft), aux_layers, target_dir


def _prompt_row(set_name: str, prompt, ids: list[int], base, spec, steps: int, tokenizer, precision: str,
                rescore) -> dict:
    """One prompt's figures and its lossless verdict (eagle3.evaluate.lossless.judge)."""
    from eagle3.evaluate.lossless import judge

    row = {
        "set": set_name, "id": prompt.id, "prompt_tokens": len(ids), "new_tokens": len(spec.tokens),
        "stop": spec.stop, "acceptance_length": metrics.acceptance_length(spec.steps),
        "verifications": len(spec.steps), "seconds_base": base.seconds, "seconds_spec": spec.seconds,
        "base_tokens": len(base.tokens), "accept_hist": metrics.accept_length_histogram(spec.steps, steps),
        "counts": metrics.prompt_counts(spec.steps, steps), "token_ids": list(spec.tokens),
        "text": tokenizer.decode(spec.tokens, skip_special_tokens=False)[:2000],
    }
    judge(row, ids, base.tokens, spec.tokens, precision, rescore)
    if "mismatch" in row:
        row["mismatch"]["baseline_text"] = tokenizer.decode(base.tokens)[:2000]
    return row


def proposed_by(steps: list) -> dict:
    """Draft tokens proposed and accepted per proposer (the prompt lookup's and the draft's) over the rounds."""
    looked = sum(len(s.looked_up) for s in steps)
    looked_ok = sum(1 for s in steps for i in s.looked_up if i < s.accepted)
    drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
    return {"lookup": {"proposed": looked, "accepted": looked_ok},
            "draft": {"proposed": drafted - looked, "accepted": accepted - looked_ok}}


def _set_summary(rows: list[dict], steps: list, k: int, precision: str, reach: dict) -> dict:
    """τ, acceptance by position, both throughputs (timed in the same run), the lossless verdict and ``reach``
    (`metrics.vocab_reach` of the baseline answers) of one prompt set."""
    from eagle3.evaluate.lossless import verdict

    base_s, spec_s = sum(r["seconds_base"] for r in rows), sum(r["seconds_spec"] for r in rows)
    base_tokens, spec_tokens = sum(r["base_tokens"] for r in rows), sum(r["new_tokens"] for r in rows)
    tps_base = base_tokens / base_s if base_s > 0 else 0.0
    tps_spec = spec_tokens / spec_s if spec_s > 0 else 0.0
    return {
        "acceptance_length": metrics.acceptance_length(steps),
        "accept_rate_by_position": metrics.accept_rate_by_position(steps, k),
        "accept_hist": metrics.accept_length_histogram(steps, k),
        "tokens_per_s_spec": tps_spec, "tokens_per_s_base": tps_base,
        "speedup": tps_spec / tps_base if tps_base > 0 else 0.0,
        "num_prompts": len(rows), "generated_tokens": spec_tokens, "verifications": len(steps),
        "lossless_prompts": sum(r["lossless"] for r in rows),
        "lossless_verdict": verdict(rows, precision),
        "proposed_by": proposed_by(steps),
        "vocab_reach": reach,
    }


def measure(cfg: EvaluateConfig) -> dict[str, Any]:
    """Both decodes of every prompt; the report (not written, not gated)."""
    import torch

    from eagle3.evaluate.prompts import encode_prompt, load_prompt_sets
    from eagle3.evaluate.spec_decode import eos_token_ids, greedy_generate, speculative_generate
    from eagle3.devices import resolve_device, resolve_precision
    from eagle3.progress import Progress

    prompt_sets = load_prompt_sets(cfg.prompts, cfg.limit)
    offline = offline_sim_accept_len(cfg.checkpoint) if cfg.checkpoint else None
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.precision, device, workload="decode")  # batch-1 steps, not big GEMMs
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    tokenizer, model, target, draft, aux_layers, target_dir = _load(cfg, device, precision.name)
    from eagle3.evaluate.lossless import TargetRescorer, verdict

    rescore = TargetRescorer(target_dir, device, precision.name, low_model=model)
    log.info("evaluate: target in %s on %s (%s); baseline and speculative decode both", precision.name, device,
             precision.reason)
    eos = eos_token_ids(model, tokenizer)
    encoded = {name: [encode_prompt(tokenizer, p) for p in ps] for name, ps in prompt_sets.items()}
    lookup = cfg.proposer == "lookup+draft"
    vd = draft.draft.d2t.shape[0]
    draft_vocab = frozenset(draft.draft.draft_to_target(torch.arange(vd, device=draft.device)).tolist())
    if cfg.warmup:
        first = next(iter(encoded.values()))[0]
        greedy_generate(target, first, 4, eos)
        speculative_generate(target, draft, first, 4, eos, cfg.steps, lookup)

    total = sum(len(p) for p in prompt_sets.values())
    progress = Progress("evaluate", total_samples=total, total_tokens=total * cfg.max_new_tokens)
    sets: dict[str, dict] = {}
    rows: list[dict] = []
    for name, prompts in prompt_sets.items():
        set_rows, steps, answers = [], [], []
        for prompt, ids in zip(prompts, encoded[name]):
            base = greedy_generate(target, ids, cfg.max_new_tokens, eos)
            spec = speculative_generate(target, draft, ids, cfg.max_new_tokens, eos, cfg.steps, lookup)
            set_rows.append(_prompt_row(name, prompt, ids, base, spec, cfg.steps, tokenizer, precision.name,
                                        rescore))
            steps += spec.steps
            answers.append(base.tokens)
            progress.update(samples=1, tokens=len(spec.tokens))
        sets[name] = _set_summary(set_rows, steps, cfg.steps, precision.name,
                                  metrics.vocab_reach(answers, draft_vocab))
        rows += set_rows
        log.info("evaluate[%s]: tau %.3f, accept rates %s, x%.2f", name, sets[name]["acceptance_length"],
                 sets[name]["accept_rate_by_position"], sets[name]["speedup"])
    progress.finish()

    primary = next(iter(sets))
    report = {
        # Headline figures are the primary (first) prompt set's; `sets` holds every set's.
        **sets[primary],
        "lossless": all(r["lossless"] for r in rows),
        "lossless_verdict": verdict(rows, precision.name),
        "primary_set": primary,
        "sets": sets,
        "set_order": list(sets),
        "steps": cfg.steps,
        "proposer": cfg.proposer,
        "max_new_tokens": cfg.max_new_tokens,
        "sim_accept_len": offline["sim_accept_len"] if offline else None,
        # The trainer's estimate runs over all TTT steps; truncated to k it is comparable with τ (both ≤ k+1).
        "sim_accept_len_k": metrics.simulated_acceptance_length(offline["acc"][: cfg.steps])
        if offline and offline["acc"] else None,
        "offline": offline,
        "prompts_source": primary,
        "target": cfg.model,
        "draft": cfg.draft,
        "aux_layers": aux_layers,
        "device": device,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        # The one precision of both decodes, and why it was chosen (eagle3.devices.resolve_precision).
        "precision": precision.to_dict(),
        "backend": "transformers",
        "torch_threads": torch.get_num_threads(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompts": rows,
    }
    return report
