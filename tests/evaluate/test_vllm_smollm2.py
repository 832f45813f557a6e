"""vLLM (the real engine, CPU build, its own venv) runs this project's export of a SmolLM2 draft: it loads,
speculation is lossless token for token, and on the same output its per-prompt acceptance counts equal the
project decoder's exactly. The draft reads NON-default aux layers and is fitted so that it is accepted only
when fed the layer it was fitted on (tests/evaluate/lens_draft.py); the old export (only eagle_config, which
vLLM takes one layer too early) must lose that acceptance.

The draft of the two-engine run is an EAGLE 3.1 draft (fc_norm with a non-uniform gain the lens was fitted
through, norm_output): vLLM serves it from the exported config keys, with the acceptance counts of the project
decoder. The old-export draft is plain EAGLE-3.

Three vLLM starts (baseline, EAGLE-3.1, EAGLE-3 on the old export), --enforce-eager, shared by the tests of
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
# SmolLM2 answers these with period two ("Hello, hello, hello, ..."). The draft's fc maps layer 0's output
# to the token's embedding (fitted on FIT_TEXTS, not on these), whose lens is the token itself, the right
# guess for the token after next: measured with transformers, 0.48 / 0.45 of the positions fed layer 0's
# output, 0.0 / 0.0 fed the embeddings (what vLLM feeds for id 0 of the old export).
REPEATS = ["Write the word 'hello' twenty times, separated by spaces.",
           "Write the word 'cat' twenty times, separated by spaces."]
FIT_TEXTS = ["dog, dog, dog, dog, dog, dog, dog, dog, dog, dog, dog, dog",
             "The quick brown fox jumps over the lazy dog. Then it runs home, eats, and sleeps until noon.",
             "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # five",
             "Yes no. Yes no. I'm ready to help. What's your next question?"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("vllm-prompts") / "repeats.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in REPEATS))
    return str(path)


@pytest.fixture(scope="module")
def both_engines(smollm2_dir, tmp_path_factory, prompts):
    """One evaluate run: the project decoder, then vLLM (two servers), on the same prompts."""
    tmp = tmp_path_factory.mktemp("vllm-eval")
    draft = lens_draft(smollm2_dir, tmp / "draft", AUX, fit_texts=FIT_TEXTS, variant="eagle3.1")
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
    cfg = json.loads((tmp_draft(both_engines) / "config.json").read_text())
    assert (cfg["draft_variant"], cfg["fc_norm"], cfg["norm_output"]) == ("eagle3.1", True, True)
    assert all(p["verifications"] > 0 for p in vllm["prompts"])  # the counters moved for every prompt
    assert summary["lossless"] is True


def tmp_draft(both_engines):
    return both_engines[3] / "draft"


def test_vllm_accepts_what_the_project_decoder_accepts_on_non_default_aux_layers(both_engines):
    _, report, vllm, _ = both_engines
    ours, theirs = report["engines"]["transformers"], report["engines"]["vllm"]
    print(f"τ decoder {ours['tau']:.3f} vLLM {theirs['tau']:.3f}; same output on "
          f"{report['agreement']['vllm']['same_greedy_output']}/{LIMIT} prompts")
    assert ours["tau"] > 1.3, ours  # fed the layer it was fitted on, the draft is accepted
    assert abs(ours["tau"] - theirs["tau"]) < 0.05, (ours["tau"], theirs["tau"])
    assert report["agreement"]["vllm"]["tau"]["agree"], report["agreement"]["vllm"]
    # Where both engines generated the same tokens, they count the same acceptances, prompt by prompt.
    theirs_by_id = {p["id"]: p for p in vllm["prompts"]}
    same = [(p["counts"], theirs_by_id[p["id"]]["counts"]) for p in report["prompts"]
            if p["token_ids"] == theirs_by_id[p["id"]]["token_ids"]]
    assert same and report["agreement"]["vllm"]["same_greedy_output"] == len(same)
    assert all(a == b for a, b in same), same


def test_the_old_export_makes_vllm_read_another_layer(both_engines, smollm2_dir, prompts):
    from eagle3.evaluate.vllm_bench import VLLMBenchmark

    _, report, _, tmp = both_engines
    old = tmp / "old-draft"
    lens_draft(smollm2_dir, old, AUX, fit_texts=FIT_TEXTS)
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
    # The old ids make vLLM feed the draft the embeddings instead of layer 0's output: the fitted lens
    # no longer finds the token, and the acceptance the project decoder measured is gone.
    ours = report["engines"]["transformers"]["tau"]
    print(f"τ old export in vLLM {old_tau:.3f} vs decoder {ours:.3f}")
    assert old_tau < ours - 0.25, (old_tau, ours, report["engines"]["vllm"]["tau"])
