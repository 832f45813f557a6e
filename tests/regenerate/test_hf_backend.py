"""The hf backend: batched generate on a tiny random Llama with SmolLM2's tokenizer and template."""

from __future__ import annotations

import asyncio

import pytest
from regen_helpers import conversations, read_jsonl, write_dataset

from eagle3.regenerate import RegenerateConfig, regenerate
from eagle3.regenerate.hf_backend import HFBackend

PROMPTS = [[{"role": "user", "content": "hi"}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a much longer question here"}],
           [{"role": "user", "content": "what is two plus two, explain in detail please"}]]


async def _answers(model: str, batch_size: int, prompts, precision: str = "float32") -> list:
    async with HFBackend(model, batch_size=batch_size, max_tokens=12, precision=precision) as b:
        results = await asyncio.gather(*(b.complete(p) for p in prompts))
        return results, b.batches


@pytest.fixture(scope="module")
def runs(tiny_llama_dir):
    """The same prompts generated as one batch and one by one, in fp32 (loaded once: this CPU is shared)."""
    return asyncio.run(_answers(tiny_llama_dir, 8, PROMPTS)), asyncio.run(_answers(tiny_llama_dir, 1, PROMPTS))


def test_batched_greedy_equals_one_by_one(runs):
    """fp32: left padding, its mask and the positions change no token."""
    (batched, n_batches), (single, n_single) = runs
    assert n_batches == 1 and n_single == 3  # the requests really were batched together
    assert [c.content for c in batched] == [c.content for c in single]
    assert [c.completion_tokens for c in batched] == [c.completion_tokens for c in single]
    assert [c.token_ids for c in batched] == [c.token_ids for c in single]


def test_batched_bf16_differs_only_by_tie_flips(tiny_llama_dir):
    """bf16 (what the policy picks on an AMX/AVX512-BF16 CPU): the random model's top logits are ~0.6-0.7 apart
    by ~0.005, under one bf16 step (2^-8 relative), so a batched and a single run may swap two tokens. Every
    first difference must be such a tie: re-scored in fp32, within the rounding measured at that prefix."""
    import torch

    from eagle3.evaluate.lossless import classify, first_difference
    from eagle3.target import load_model, load_tokenizer

    (batched, _), (single, _) = (asyncio.run(_answers(tiny_llama_dir, n, PROMPTS, "bfloat16")) for n in (8, 1))
    tok = load_tokenizer(tiny_llama_dir)
    m32, m16 = load_model(tiny_llama_dir, precision="float32"), load_model(tiny_llama_dir, precision="bfloat16")
    for prompt, b, s in zip(PROMPTS, batched, single):
        at = first_difference(b.token_ids, s.token_ids)
        if at is None:
            continue
        ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids) + s.token_ids[:at]
        with torch.no_grad():
            l32, l16 = (m(input_ids=torch.tensor([ids])).logits[0, -1] for m in (m32, m16))
        verdict = classify(l32, l16, s.token_ids[at], b.token_ids[at], "bfloat16")
        assert verdict["tie"], verdict


def test_accounting_counts_template_tokens(tiny_llama_dir, runs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    (results, _), _ = runs
    for prompt, c in zip(PROMPTS, results):
        ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert c.prompt_tokens == len(ids)
        assert 1 <= c.completion_tokens <= 12
        assert c.finish_reason in ("stop", "length")
        assert (c.completion_tokens == 12) == (c.finish_reason == "length")


def test_stage_with_hf_backend(tiny_llama_dir, tmp_path):
    manifest = write_dataset(tmp_path, conversations(3, turns=2))
    summary = regenerate(RegenerateConfig(manifest=str(manifest), out=str(tmp_path / "out"), backend="hf",
                                          model=tiny_llama_dir, concurrency=3, max_tokens=6))
    stats = summary["datasets"]["chat"]
    recs = read_jsonl(tmp_path / "out/chat/regenerated.jsonl")
    assert stats["done"] == 3 and stats["requests"] == 6 and len(recs) == 3
    assert all(r["regeneration"]["backend"] == "hf" and len(r["regeneration"]["turns"]) == 2 for r in recs)
    assert stats["completion_tokens"] == sum(t["completion_tokens"] for r in recs for t in r["regeneration"]["turns"])
    assert stats["this_run"]["completion_tokens"] == stats["completion_tokens"]
    # Turn 2's prompt holds turn 1's answer, so it is longer than turn 1's prompt plus the new question.
    t0, t1 = recs[0]["regeneration"]["turns"]
    assert t1["prompt_tokens"] > t0["prompt_tokens"] + t0["completion_tokens"] - 1


@pytest.mark.slow
def test_smollm2_answers_sensibly(smollm2_dir):
    results, _ = asyncio.run(_answers(smollm2_dir, 2, [[{"role": "user", "content": "What is the capital of France?"}]]))
    assert "Paris" in results[0].content


def test_stage_records_the_precision_it_generated_in(tiny_llama_dir, tmp_path):
    """stats.json's this_run names the compute precision (forced bf16 here: the slow path on an AVX2-only CPU,
    short on the tiny model); the records' settings do not (so a resume on another machine kind is allowed)."""
    import json

    from eagle3.devices import resolve_precision

    manifest = write_dataset(tmp_path, conversations(2, turns=1))
    for precision in ("auto", "bfloat16"):
        out = tmp_path / f"out-{precision}"
        summary = regenerate(RegenerateConfig(manifest=str(manifest), out=str(out), backend="hf", model=tiny_llama_dir,
                                              concurrency=2, max_tokens=4, precision=precision))
        got = summary["datasets"]["chat"]["this_run"]["precision"]
        want = resolve_precision(precision, "cpu")
        assert got == want.to_dict() and got["requested"] == precision
        assert json.loads((out / "chat/stats.json").read_text())["this_run"]["precision"] == got
        assert all("precision" not in r["regeneration"] for r in read_jsonl(out / "chat/regenerated.jsonl"))

