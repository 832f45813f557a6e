"""Losslessness on the real SmolLM2-135M-Instruct with HumanEval prompts (slow: real model on CPU)."""

from __future__ import annotations

import json

import pytest

from eagle3.evaluate import EvaluateConfig, evaluate

pytestmark = pytest.mark.precision  # the numbers follow the precision policy (make test forces both)


@pytest.mark.slow
def test_speculative_equals_greedy_on_smollm2(smollm2_dir, tmp_path, make_draft):
    # A target-initialised, untrained draft: it is right now and then, so both the accept and the
    # reject paths run on the real model.
    draft = make_draft(smollm2_dir, tmp_path / "draft", init="target", vd=8192)
    summary = evaluate(EvaluateConfig(model=smollm2_dir, draft=draft, out=str(tmp_path / "eval"),
                                      prompts="humaneval", limit=2, max_new_tokens=24, device="cpu"))
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert summary["lossless"] is True
    assert all(p["lossless"] for p in report["prompts"])
    assert [p["id"] for p in report["prompts"]] == ["HumanEval/0", "HumanEval/1"]
    assert 1.0 <= summary["acceptance_length"] <= 4.0
    assert report["aux_layers"] == [1, 14, 26]  # SmolLM2 has 30 layers: [1, L/2-1, L-4]
