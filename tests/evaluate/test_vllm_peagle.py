"""vLLM (the real engine, CPU build) serves this project's P-EAGLE draft with `parallel_drafting`: it loads
`mask_hidden` and `mask_token_id` from the export, its output is the fp32 greedy output, and its per-prompt
acceptance counts, at every draft position, equal the project decoder's. The draft is trained by the trainer
(parallel_drafting=True) on SmolLM2's own answers to the two prompts, so its mask slots are right often: a
slot that vLLM fed differently (another position, token or hidden) would be accepted at other rounds.

One vLLM start (the P-EAGLE server; ~60 s in all here; the greedy reference is the transformers target's, fp32
as vLLM here: the project decoder's baseline), --enforce-eager; the compile cache under ~/.cache/eagle3/vllm is
reused.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PROMPTS = ["Write the word 'hello' twenty times, separated by spaces.",
           "Count from one to twenty in words, separated by commas."]
NEW_TOKENS, K = 40, 3


@pytest.fixture(scope="module")
def peagle_run(smollm2_dir, tmp_path_factory):
    import torch

    from eagle3.evaluate import EvaluateConfig, evaluate
    from eagle3.evaluate.prompts import encode_prompt, load_prompt_sets
    from eagle3.evaluate.spec_decode import TargetRunner, greedy_generate
    from eagle3.evaluate.vllm_bench import VLLMBenchmark
    from eagle3.export import ExportConfig, export
    from eagle3.target import load_model, load_tokenizer
    from eagle3.train.config import TrainConfig
    from eagle3.train.loop import train
    from tests.train.train_helpers import build_store

    tmp = tmp_path_factory.mktemp("peagle")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    tok = load_tokenizer(smollm2_dir)
    runner = TargetRunner(load_model(smollm2_dir, precision="float32"))
    seqs = []
    for prompt in load_prompt_sets(str(prompts))[str(prompts)]:
        ids = encode_prompt(tok, prompt)
        seqs.append(ids + greedy_generate(runner, ids, NEW_TOKENS + 8, frozenset()).tokens)
    del runner
    torch.set_num_threads(2)
    store, vocab = build_store(tmp, smollm2_dir, seqs=seqs, draft_vocab=256)
    train(TrainConfig(store=store, vocab=vocab, out=str(tmp / "ckpt"), ttt_length=K, parallel_drafting=True,
                      token_budget=4096, epochs=60, lr=2e-3, log_every=20, eval_every=0, heldout_share=0.0,
                      init="target", device="cpu", precision="float32"))
    draft = str(tmp / "draft")
    export(ExportConfig(checkpoint=str(tmp / "ckpt"), out=draft, dtype="float32"))
    ev = EvaluateConfig(model=smollm2_dir, draft=draft, out=str(tmp / "eval"), prompts=str(prompts),
                        limit=len(PROMPTS), max_new_tokens=NEW_TOKENS, steps=K, device="cpu", precision="float32")
    summary = evaluate(ev)
    report = json.loads((tmp / "eval" / "report.json").read_text())
    bench = VLLMBenchmark(ev)
    ids = [encode_prompt(tok, p) for p in load_prompt_sets(str(prompts))[str(prompts)]]
    phase = bench.run_phase("eagle3", bench.server("eagle3", smollm2_dir, "float32"), ids)
    return summary, report, phase, draft


def test_vllm_serves_the_p_eagle_export_losslessly(peagle_run):
    summary, report, phase, draft = peagle_run
    cfg = json.loads(open(f"{draft}/config.json").read())
    assert cfg["parallel_drafting"] is True and isinstance(cfg["mask_token_id"], int)
    spec = json.loads(phase["command"][-1])
    assert spec["parallel_drafting"] is True and spec["num_speculative_tokens"] == K
    assert summary["lossless"] is True and all(p["lossless"] for p in report["prompts"])
    # vLLM's speculative output is the fp32 greedy output (the project decoder's, itself checked against the
    # transformers target's plain greedy decode) on every prompt.
    assert [r["token_ids"] for r in phase["requests"]] == [p["token_ids"] for p in report["prompts"]]


def test_vllm_accepts_at_every_position_what_the_project_decoder_accepts(peagle_run):
    from eagle3.acceptance import tau_of

    _, report, phase, _ = peagle_run
    ours, theirs = [p["counts"] for p in report["prompts"]], [r["counts"] for r in phase["requests"]]
    print(f"P-EAGLE τ decoder {tau_of(ours):.3f} vLLM {tau_of(theirs):.3f}")
    assert ours == theirs, (ours, theirs)
    # The mask slots are accepted (positions 2 and 3 of a round): the comparison covers them.
    assert all(c["accepted"][1] > 0 and c["accepted"][2] > 0 for c in ours), ours
    assert tau_of(ours) > 2.0, ours
