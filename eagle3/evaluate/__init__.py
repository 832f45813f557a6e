"""The evaluate stage: the exported draft decoded against its target, τ, speed and the lossless check.

``evaluate(EvaluateConfig)`` runs on ``backend``: ``transformers`` (the project's own decoder,
:mod:`eagle3.evaluate.decoder_bench`), ``vllm`` (:mod:`eagle3.evaluate.vllm_bench`) or ``sglang``
(GPU clusters), the engines started twice, baseline then EAGLE-3. ``compare_with`` runs more
backends on the same prompts and sets their acceptance side by side (:mod:`eagle3.evaluate.compare`).
Prompt sets are :mod:`eagle3.evaluate.prompts`. Nothing heavy is imported here.
"""

import dataclasses
import logging

from eagle3.evaluate.config import EvaluateConfig

log = logging.getLogger(__name__)


def _measure(backend: str, cfg: EvaluateConfig) -> dict:
    if backend == "vllm":
        from eagle3.evaluate.vllm_bench import measure
    else:
        from eagle3.evaluate.decoder_bench import measure
    return measure(cfg)


def evaluate(cfg: EvaluateConfig) -> dict:
    """Benchmark the draft on ``cfg.backend`` (and ``cfg.compare_with``); write EVAL/report.json (and
    EVAL/<backend>_report.json per compared engine); return its summary.

    Raises GateFailed (after writing the report) when any engine's speculative output differs from its baseline's.
    """
    from eagle3.export import check_draft

    check_draft(cfg.draft)  # the weights match what export wrote, before any engine loads them
    if cfg.backend == "sglang":
        from eagle3.evaluate.sglang_bench import from_evaluate_config, sglang_benchmark

        return sglang_benchmark(from_evaluate_config(cfg))
    from eagle3 import layout, storage
    from eagle3.evaluate.compare import combine, disagreements
    from eagle3.evaluate.gate import gate

    reports = {cfg.backend: _measure(cfg.backend, cfg)}
    # The engines are compared on the headline set only, so the others decode only that one.
    headline = dataclasses.replace(cfg, prompts=str(cfg.prompts).split(",")[0].strip())
    for backend in cfg.compare_with:
        reports[backend] = _measure(backend, headline)
    for backend in cfg.compare_with:
        storage.write_json(storage.join(cfg.out, layout.engine_report(backend)), reports[backend])
    report = combine(reports, cfg.backend) if cfg.compare_with else reports[cfg.backend]
    path = storage.join(cfg.out, layout.EVAL_REPORT)
    storage.write_json(path, report)
    for name, figures in (report.get("engines") or {cfg.backend: report}).items():
        log.info("evaluate[%s]: tau %.3f, accept rates %s, %.1f tok/s speculative vs %.1f baseline (x%.2f), "
                 "lossless=%s", name, figures["tau" if "engines" in report else "acceptance_length"],
                 figures["accept_rate_by_position"], figures["tokens_per_s_spec"], figures["tokens_per_s_base"],
                 figures["speedup"], figures["lossless"])
    for line in disagreements(report):
        log.warning("evaluate: engines disagree: %s", line)
    gate(reports, path)
    return {k: v for k, v in report.items() if k not in ("prompts", "offline")}


__all__ = ["EvaluateConfig", "evaluate"]
