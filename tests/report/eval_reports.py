"""Test input: an evaluate report.json as eagle3.evaluate writes it."""

from __future__ import annotations


def two_engine_report() -> dict:
    """An evaluate report.json of two engines (the shape of eagle3.evaluate.compare.combine)."""
    sets = {"humaneval": {"acceptance_length": 1.86, "accept_rate_by_position": [0.48, 0.49, 0.62],
                          "tokens_per_s_spec": 19.2, "tokens_per_s_base": 21.1, "speedup": 0.91, "num_prompts": 5,
                          "lossless_prompts": 5},
            "chat": {"acceptance_length": 1.12, "accept_rate_by_position": [0.11, 0.11, 0.0],
                     "tokens_per_s_spec": 11.5, "tokens_per_s_base": 21.3, "speedup": 0.54, "num_prompts": 5,
                     "lossless_prompts": 4}}
    return {**sets["humaneval"], "backend": "transformers", "sets": sets, "set_order": ["humaneval", "chat"],
            "primary_set": "humaneval", "steps": 3, "max_new_tokens": 64, "lossless": False, "device": "cpu",
            "precision": {"name": "bfloat16"},
            "engines": {"transformers": {"tau": 1.86, "tau_interval": [1.55, 2.26], "accept_rate_by_position":
                                         [0.48, 0.49, 0.62], "tokens_per_s_spec": 19.2, "tokens_per_s_base": 21.1,
                                         "speedup": 0.91, "lossless": True, "prompts": 5, "precision": "bfloat16",
                                         "lossless_verdict": {
                                             "text": "exact up to 2 tie flips (bf16)", "passed": True,
                                             "precision": "bfloat16", "failed": [],
                                             "tie_flips": [{"id": "HumanEval/0", "position": 29, "margin_fp32": -0.16893,
                                                            "tolerance": 0.50221},
                                                           {"id": "HumanEval/7", "position": 37, "margin_fp32": 0.023,
                                                            "tolerance": 0.3505}]}},
                        "vllm": {"tau": 1.86, "tau_interval": [1.55, 2.26], "accept_rate_by_position": [0.48, 0.49, 0.62],
                                 "tokens_per_s_spec": 25.3, "tokens_per_s_base": 15.4, "speedup": 1.64,
                                 "lossless": True, "prompts": 5, "precision": "bfloat16"}},
            "engine_order": ["transformers", "vllm"],
            "agreement": {"vllm": {"agree": True, "against": "transformers", "same_greedy_output": 5,
                                   "prompts_compared": 5, "tau": {"difference": 0.0, "interval": [-0.1, 0.1]}}}}
