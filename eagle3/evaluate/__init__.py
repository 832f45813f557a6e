"""The evaluate stage: the exported draft decoded against its target, τ, speed and the lossless check.

``evaluate(EvaluateConfig)`` runs on one backend: ``transformers`` (the project's own
decoder, :mod:`eagle3.evaluate.decoder_bench`), ``vllm`` or ``sglang`` (real serving engines
started twice, baseline then EAGLE-3). Prompt sets are :mod:`eagle3.evaluate.prompts`.
Nothing heavy is imported here.
"""

from eagle3.evaluate.config import EvaluateConfig


def evaluate(cfg: EvaluateConfig) -> dict:
    """Benchmark the draft on ``cfg.backend``; write EVAL/report.json; return its summary.

    Raises GateFailed (after writing the report) when any speculative output differs from the baseline's.
    """
    from eagle3.export import check_draft

    check_draft(cfg.draft)  # the weights match what export wrote, before any engine loads them
    if cfg.backend == "sglang":
        from eagle3.evaluate.sglang_bench import from_evaluate_config, sglang_benchmark

        return sglang_benchmark(from_evaluate_config(cfg))
    from eagle3.evaluate.decoder_bench import run

    return run(cfg)


__all__ = ["EvaluateConfig", "evaluate"]
