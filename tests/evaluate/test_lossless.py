"""The lossless verdict in every precision: tie flips told from decoder bugs (eagle3.evaluate.lossless)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3.errors import GateFailed
from eagle3.evaluate import EvaluateConfig, evaluate, lossless, spec_decode


def test_a_near_tie_within_the_measured_rounding_is_a_tie_flip():
    # Hand-computed: the fp32 margin of tokens 0 and 1 is 0.02; the low-precision logits carry errors
    # -0.012 / +0.010 / 0 / 0 on the top tokens, a spread of 0.022, so two runs (each allowed twice that)
    # can swap tokens 0.088 apart.
    l32 = torch.tensor([1.00, 0.98, 0.5, 0.2])
    low = torch.tensor([0.988, 0.99, 0.5, 0.2])
    tie = lossless.classify(l32, low, 0, 1, "bfloat16")
    assert tie["noise"] == pytest.approx(0.022, abs=1e-6) and tie["tolerance"] == pytest.approx(0.088, abs=1e-6)
    assert tie["tie"] and tie["margin_fp32"] == pytest.approx(0.02, abs=1e-6) and tie["fp32_argmax"] == 0
    assert tie["margin_low"] == pytest.approx(-0.002, abs=1e-6)  # flipped in low precision
    # The same rounding cannot explain a token 0.5 below the argmax (a wrongly accepted draft token) ...
    assert lossless.classify(l32, low, 0, 2, "bfloat16")["margin_fp32"] == pytest.approx(0.5)
    assert not lossless.classify(l32, low, 0, 2, "bfloat16")["tie"]
    # ... and with no noise measured the floor is two units of bf16 rounding (2^-8 relative) of the logits:
    near = torch.tensor([5.00, 4.97, 1.0])
    flat = lossless.classify(near, near, 0, 1, "bfloat16")
    assert flat["noise"] == 0 and flat["tolerance"] == pytest.approx(2 * 2 ** -8 * 5.0) and flat["tie"]
    assert not lossless.classify(l32, l32, 0, 1, "bfloat16")["tie"]  # 0.02 > 2 * 2^-8 * 1.0
    # In fp32 the floor is 2^-16 relative (what the shape of a forward moves an fp32 logit by, measured up to 1.2e-4
    # on SmolLM2): at |logit| 10 a 2e-4 margin is a tie, a 1e-3 one is not.
    assert not lossless.classify(near, near, 0, 1, "float32")["tie"]
    assert lossless.classify(torch.tensor([3.0, 3.0]), torch.tensor([3.0, 3.0]), 0, 1, "float32")["tie"]
    fp32 = lossless.classify(torch.tensor([10.0, 10.0 - 2e-4]), torch.tensor([10.0, 10.0 - 2e-4]), 0, 1, "float32")
    assert fp32["tolerance"] == pytest.approx(2 * 2 ** -16 * 10.0) and fp32["tie"]
    assert not lossless.classify(torch.tensor([10.0, 9.999]), torch.tensor([10.0, 9.999]), 0, 1, "float32")["tie"]


def test_the_verdict_texts_and_a_stop_difference():
    calls = []

    def rescore(prefix, positions=1):
        calls.append(prefix)
        if prefix == [7, 8, 1, 1]:  # the speculative path after the flip: the target chooses its 2
            return torch.tensor([0.0, 0.0, 3.0]), torch.tensor([0.0, 0.0, 3.0])
        return torch.tensor([2.0, 1.999, 0.0]), torch.tensor([2.0, 1.999, 0.0])

    exact = lossless.judge({"id": "a"}, [7, 8], [1, 2, 0], [1, 2, 0], "bfloat16", rescore)
    flip = lossless.judge({"id": "b"}, [7, 8], [1, 0, 2], [1, 1, 2], "bfloat16", rescore)
    # re-scored at the prefix before the first difference, then the speculative path after it once
    assert calls == [[7, 8, 1], [7, 8, 1, 1]]
    assert exact["exact"] and exact["lossless"] and "mismatch" not in exact
    assert not flip["exact"] and flip["lossless"] and flip["tie_flip"]["position"] == 1
    assert lossless.verdict([exact], "bfloat16")["text"] == "exact"
    v = lossless.verdict([exact, flip], "bfloat16")
    assert v["text"] == "exact up to 1 tie flip (bf16)" and v["passed"] and v["exact_prompts"] == 1
    stopped = lossless.judge({"id": "c"}, [7], [1, 2], [1, 2, 3], "bfloat16", rescore)  # one went on after a stop
    assert not stopped["lossless"] and stopped["mismatch"]["speculative_token"] == 3 and len(calls) == 2
    failed = lossless.verdict([exact, flip, stopped], "bfloat16")
    assert failed["text"] == "FAILED" and not failed["passed"] and [f["id"] for f in failed["failed"]] == ["c"]


def _evaluate(model, tmp_path, draft, precision, limit, max_new_tokens, device="cpu"):
    out = tmp_path / f"eval-{device}-{precision}"
    cfg = EvaluateConfig(model=model, draft=draft, out=str(out), prompts="humaneval", limit=limit,
                         max_new_tokens=max_new_tokens, device=device, precision=precision, warmup=False)
    try:
        evaluate(cfg)
        error = None
    except GateFailed as e:
        error = str(e)
    return json.loads((out / "report.json").read_text()), error


@pytest.fixture(scope="module")
def smol_draft(smollm2_dir, tmp_path_factory, make_draft):
    # Target-initialised and untrained: right now and then, so both the accept and reject paths run.
    return make_draft(smollm2_dir, tmp_path_factory.mktemp("draft"), init="target", vd=8192)


@pytest.mark.slow
def test_bf16_forced_on_smollm2_is_exact_up_to_tie_flips(smollm2_dir, tmp_path, smol_draft):
    """bf16 forced (on any machine), HumanEval prompts of 64 tokens: 10 where the machine has a bf16 matrix engine
    (the path its policy picks, where tie flips were first seen), 5 where bf16 is emulated (no such engine: 10 took
    246 s of a 30-min CI on an AVX2 machine)."""
    from eagle3.devices import BF16_CPU_FLAGS, cpu_flags

    prompts = 10 if set(BF16_CPU_FLAGS) & cpu_flags() else 5  # the machine's engine, not $EAGLE3_PRECISION
    report, error = _evaluate(smollm2_dir, tmp_path, smol_draft, "bfloat16", prompts, 64)
    v = report["lossless_verdict"]
    assert report["precision"]["name"] == "bfloat16" and report["dtype"] == "bfloat16"
    assert error is None and v["passed"] and report["lossless"], v
    assert v["text"] == "exact" or v["text"].startswith("exact up to ") and v["text"].endswith("(bf16)")
    assert v["exact_prompts"] + len(v["tie_flips"]) == v["prompts"] == prompts
    for t in v["tie_flips"]:  # each one re-scored, and within the rounding measured at its prefix
        assert abs(t["margin_fp32"]) <= t["tolerance"] < 2.0  # bf16 rounding of SmolLM2 logits (~10-30)
        assert t["fp32_argmax"] in (t["baseline_token"], t["speculative_token"]) or t["noise"] > 0
    print(f"\nbf16 SmolLM2, {prompts}x64: {v['text']}; tie flips "
          f"{[(t['id'], t['position'], round(t['margin_fp32'], 4), round(t['tolerance'], 4)) for t in v['tie_flips']]}")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_planted_decoder_bug_fails_in_both_precisions(smollm2_dir, tmp_path, smol_draft, monkeypatch, precision):
    """Off by one: the first rejected draft token is accepted too. The gate must fail; no rounding explains it."""
    right = spec_decode.accepted_prefix

    def one_too_many(drafts, best):
        n = right(drafts, best)
        return min(n + 1, len(drafts))

    monkeypatch.setattr(spec_decode, "accepted_prefix", one_too_many)
    report, error = _evaluate(smollm2_dir, tmp_path, smol_draft, precision, 3, 32)
    v = report["lossless_verdict"]
    assert v["text"] == "FAILED" and not v["passed"] and not report["lossless"]
    assert error is not None and "fp32 margin" in error and "not lossless" not in error
    assert all(abs(f["margin_fp32"]) > f["tolerance"] for f in v["failed"] if "margin_fp32" in f)


GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def wide_target(tmp_path_factory, tokenizer_dir):
    """A random 1024-wide, 4-layer Llama with SmolLM2's tokenizer, its lm_head peaked (x20) . On GPU-sized
    matrices: cuBLAS bf16 and SDPA's kernels, not the 64-wide fixture's. Its last layer's output projections are
    zero, so the lens of layer 2 (`_lens`) sees the state the target's head reads."""
    from tests.tiny_llama import save_random_llama, tiny_llama_config
    from tests.train.train_helpers import peaked_copy

    root = tmp_path_factory.mktemp("wide-target")
    cfg = tiny_llama_config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                            num_key_value_heads=4)
    target = peaked_copy(save_random_llama(root / "random", cfg, tokenizer_dir), root / "peaked")
    from safetensors.torch import load_file, save_file

    weights = load_file(f"{target}/model.safetensors")  # the last layer adds nothing: layer 2's lens is exact
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        weights[f"model.layers.3.{name}.weight"].zero_()
    save_file(weights, f"{target}/model.safetensors", metadata={"format": "pt"})
    return target


def _lens(target, tmp_path) -> str:
    """The logit lens of layer 2 (tests/evaluate/lens_draft.py), which is the wide target's last state: it guesses
    the token the target has just emitted, right wherever the target repeats one, so both the accept and the
    reject paths run."""
    from tests.evaluate.lens_draft import lens_draft

    return lens_draft(target, tmp_path / "lens", aux=(0, 1, 2), slot=2)


@pytest.mark.parametrize("precision", ["bfloat16", "float32"])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=GPU)])
def test_the_decoder_on_a_gpu_is_lossless_up_to_tie_flips(wide_target, tmp_path, device, precision):
    draft = _lens(wide_target, tmp_path)
    report, error = _evaluate(wide_target, tmp_path, draft, precision, 8, 64, device)
    v = report["lossless_verdict"]
    assert report["device"] == device and report["precision"]["name"] == precision == report["dtype"]
    assert error is None and v["passed"] and report["lossless"], v
    assert v["text"].startswith("exact") and v["exact_prompts"] + len(v["tie_flips"]) == v["prompts"] == 8
    assert report["acceptance_length"] > 1.2, report["acceptance_length"]  # the accept path ran (1.34-1.46 on CPU)
    for t in v["tie_flips"]:
        assert abs(t["margin_fp32"]) <= t["tolerance"]
    print(f"\n{device} {precision}: {v['text']}, tau {report['acceptance_length']:.3f} over {v['prompts']} prompts")


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=GPU)])
def test_a_planted_decoder_bug_fails_on_a_gpu(wide_target, tmp_path, monkeypatch, device):
    right = spec_decode.accepted_prefix
    monkeypatch.setattr(spec_decode, "accepted_prefix", lambda drafts, best: min(right(drafts, best) + 1, len(drafts)))
    draft = _lens(wide_target, tmp_path)
    report, error = _evaluate(wide_target, tmp_path, draft, "bfloat16", 4, 32, device)
    v = report["lossless_verdict"]
    assert v["text"] == "FAILED" and not report["lossless"] and error is not None
    assert all(abs(f["margin_fp32"]) > f["tolerance"] for f in v["failed"] if "margin_fp32" in f)


def test_the_path_after_a_tie_flip_is_checked_and_a_far_second_choice_is_no_tie():
    """A flip hides nothing after it: the speculative tokens after a tie flip are re-scored teacher-forced, and
    one that is not the target's choice (nor a tie of it) fails the prompt. And a tie needs both tokens near the
    fp32 maximum, not only near each other."""
    V = 12

    def logits(best: int, second: int | None = None, gap: float = 0.001):
        row = torch.zeros(V)
        row[best] = 5.0
        if second is not None:
            row[second] = 5.0 - gap
        return row

    # prompt [7], baseline [1, 2, 3, 4], speculative [1, 9, 5, 6]: a near-tie 2/9 at position 1; after it the
    # target (teacher-forced on the speculative path) chooses 5 then 8, but the speculative output has 6.
    def rescore(prefix, positions=1):
        if positions == 1:
            return logits(2, 9), logits(9, 2)
        after = torch.stack([logits(5), logits(8)])  # predictions for positions 2 and 3
        return after, after

    bad = lossless.judge({"id": "late"}, [7], [1, 2, 3, 4], [1, 9, 5, 6], "bfloat16", rescore)
    assert not bad["lossless"] and "tie_flip" not in bad
    assert bad["mismatch"]["position"] == 3 and bad["mismatch"]["after_tie_flip_at"] == 1
    assert bad["mismatch"]["baseline_token"] == 8 and bad["mismatch"]["speculative_token"] == 6
    from eagle3.evaluate.gate import mismatches

    assert "not the target's choice at generated position 3 after a tie flip at 1" in mismatches({"prompts": [bad]})[0]

    def rescore_ok(prefix, positions=1):
        if positions == 1:
            return logits(2, 9), logits(9, 2)
        after = torch.stack([logits(5), logits(8, 6)])  # 6 is a near-tie of the target's 8: a second flip
        return after, after

    good = lossless.judge({"id": "ok"}, [7], [1, 2, 3, 4], [1, 9, 5, 6], "bfloat16", rescore_ok)
    assert good["lossless"] and good["tie_flip"]["checked_after"] == 2 and good["tie_flip"]["ties_after"] == 1

    # tokens 0.02 apart but both 1.0 below the fp32 maximum: neither run's greedy choice, so no tie
    far = torch.tensor([6.0, 5.0, 4.98, 0.0])
    assert not lossless.classify(far, far + torch.tensor([0.0, 0.0, 0.03, 0.0]), 1, 2, "bfloat16")["tie"]
