"""Evaluate a draft: real speculative decoding (transformers backend), the SGLang
benchmark, the publish gate and the run report.

Modules: `spec_decode` (the chain decoder), `metrics` (τ and per-position
acceptance), `prompts` (HumanEval / JSONL prompts), `benchmark` (`evaluate`),
`sglang_bench` (SGLang servers), `publish` (the registry gate), `report`
(report.json, PNGs, report.html), `cli` (`eagle3 evaluate`).
"""
