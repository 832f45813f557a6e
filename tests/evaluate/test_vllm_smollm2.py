"""vLLM (the real engine, CPU build, its own venv) runs this project's export of a SmolLM2 draft: it loads,
speculation is lossless token for token, and its τ equals the project decoder's on the same prompts. The
draft reads NON-default aux layers and is built so that acceptance depends on them (tests/evaluate/lens_draft.py);
the old export (only eagle_config, which vLLM takes one layer too early) must give a clearly different τ.

Three vLLM starts (baseline, EAGLE-3, EAGLE-3 on the old export), --enforce-eager, shared by the tests of
this module; the compile cache under ~/.cache/eagle3/vllm is reused across runs.
"""

from __future__ import annotations

import json

import pytest
from lens_draft import lens_draft

from eagle3.evaluate import EvaluateConfig, evaluate

pytestmark = [pytest.mark.slow, pytest.mark.integration]

AUX = (0, 13, 27)  # SmolLM2 has 30 layers; the default would be [1, 14, 26]
LIMIT, NEW_TOKENS = 2, 32
# SmolLM2 answers these with period two ("Hello, hello, hello, ..."), where the lens of a token's embedding
# guesses the token after next ~45% of the time and the lens of layer 0's output never (measured with
# transformers: 0.48 / 0.45 vs 0.0 / 0.0).
REPEATS = ["Write the word 'hello' twenty times, separated by spaces.",
           "Write the word 'cat' twenty times, separated by spaces."]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("vllm-prompts") / "repeats.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in REPEATS))
    return str(path)


@pytest.fixture(scope="module")
def both_engines(smollm2_dir, tmp_path_factory, prompts):
    """One evaluate run: the project decoder, then vLLM (two servers), on the same prompts."""
    tmp = tmp_path_factory.mktemp("vllm-eval")
    draft = lens_draft(smollm2_dir, tmp / "draft", AUX)
    summary = evaluate(EvaluateConfig(model=smollm2_dir, draft=draft, out=str(tmp / "eval"), prompts=prompts,
                                      limit=LIMIT, max_new_tokens=NEW_TOKENS, steps=3, device="cpu",
                                      precision="float32", compare_with=("vllm",)))
    report = json.loads((tmp / "eval" / "report.json").read_text())
    vllm = json.loads((tmp / "eval" / "vllm_report.json").read_text())
    return summary, report, vllm, tmp


def test_vllm_loads_the_export_and_speculates_losslessly(both_engines):
    summary, report, vllm, _ = both_engines
    assert vllm["lossless"] is True, [p["first_difference"] for p in vllm["prompts"]]
    assert all(p["lossless"] for p in vllm["prompts"]) and len(vllm["prompts"]) == LIMIT
    assert report["engines"]["vllm"]["lossless"] and report["engines"]["transformers"]["lossless"]
    assert vllm["server"]["commands"]["eagle3"][-1].endswith("}")  # the speculative config was passed
    assert all(p["verifications"] > 0 for p in vllm["prompts"])  # the counters moved for every prompt
    assert summary["lossless"] is True


def test_vllm_tau_equals_the_project_decoder_tau_on_non_default_aux_layers(both_engines):
    _, report, vllm, _ = both_engines
    ours, theirs = report["engines"]["transformers"], report["engines"]["vllm"]
    assert abs(ours["tau"] - theirs["tau"]) < 0.1, (ours["tau"], theirs["tau"])
    assert report["agreement"]["vllm"]["tau"]["agree"], report["agreement"]["vllm"]
    assert abs(ours["accept_rate_by_position"][0] - theirs["accept_rate_by_position"][0]) < 0.08


def test_the_old_export_makes_vllm_read_another_layer(both_engines, smollm2_dir, prompts):
    from eagle3.evaluate.vllm_bench import VLLMBenchmark

    _, report, _, tmp = both_engines
    old = tmp / "old-draft"
    lens_draft(smollm2_dir, old, AUX)
    cfg = json.loads((old / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]  # the export before issue 11: vLLM reads eagle_config as is
    (old / "config.json").write_text(json.dumps(cfg))
    ev = EvaluateConfig(model=smollm2_dir, draft=str(old), out=str(tmp / "old-eval"), prompts=prompts, limit=LIMIT,
                        max_new_tokens=NEW_TOKENS, steps=3, precision="float32", backend="vllm")
    bench = VLLMBenchmark(ev)
    from eagle3.acceptance import tau_of
    from eagle3.evaluate.prompts import encode_prompt, load_prompt_sets
    from eagle3.target import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    ids = [encode_prompt(tok, p) for ps in load_prompt_sets(prompts, LIMIT).values() for p in ps]
    phase = bench.run_phase("eagle3", bench.server("eagle3", smollm2_dir, "float32"), ids)
    old_tau = tau_of([r["counts"] for r in phase["requests"]])
    # The old ids make vLLM feed the draft the embeddings instead of layer 0's output: it guesses the
    # repeats the project decoder cannot, so its τ departs from the decoder's by far more than noise.
    ours = report["engines"]["transformers"]["tau"]
    assert old_tau > ours + 0.3, (old_tau, ours, report["engines"]["vllm"]["tau"])
