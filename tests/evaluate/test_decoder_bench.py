"""evaluate(): report.json contents, the loud lossless failure, the offline τ, and the CLI."""

from __future__ import annotations

import json

import pytest

from eagle3.cli import main
from eagle3.errors import GateFailed
from eagle3.evaluate import EvaluateConfig, evaluate
from eagle3.evaluate.decoder_bench import offline_sim_accept_len
from eagle3.evaluate.summary import say

pytestmark = pytest.mark.precision  # the numbers follow the precision policy (make test forces both)




@pytest.fixture(scope="module")
def tiny_draft(tiny_llama_dir, tmp_path_factory, make_draft):
    return make_draft(tiny_llama_dir, tmp_path_factory.mktemp("draft"), aux=[1, 3, 4])


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "chat.jsonl"
    p.write_text(json.dumps({"prompt": "Write a haiku about tea."}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "What is 2+2?"},
                                            {"role": "assistant", "content": "4"}]}) + "\n"
                 + json.dumps({"prompt": "unused: cut by --limit"}) + "\n")
    return str(p)


def _ckpt(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    lines = [{"step": 10, "event": "train", "loss": 3.0, "acc_i": [0.2], "sim_accept_len": 1.3},
             {"step": 10, "event": "eval", "acc_i": [0.5, 0.4], "sim_accept_len": 1.7},
             {"step": 20, "event": "train", "acc_i": [0.6], "sim_accept_len": 1.9}]
    (ckpt / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(ckpt)


def test_evaluate_writes_a_lossless_report(tiny_llama_dir, tiny_draft, prompts, tmp_path):
    cfg = EvaluateConfig(model=tiny_llama_dir, draft=tiny_draft, out=str(tmp_path / "eval"), prompts=prompts,
                         limit=2, max_new_tokens=16, checkpoint=_ckpt(tmp_path), device="cpu")
    summary = evaluate(cfg)
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["lossless"] is True and summary["lossless"] is True
    assert [p["id"] for p in report["prompts"]] == ["chat.jsonl:1", "chat.jsonl:2"]
    assert 1.0 <= report["acceptance_length"] <= 4.0
    assert len(report["accept_rate_by_position"]) == 3
    assert report["tokens_per_s_spec"] > 0 and report["tokens_per_s_base"] > 0
    assert report["speedup"] == pytest.approx(report["tokens_per_s_spec"] / report["tokens_per_s_base"])
    assert report["aux_layers"] == [1, 3, 4] and report["steps"] == 3
    # τ is Σ emitted / Σ verifications over every prompt; the random draft accepts nothing, so no last round
    # overshoots max_new_tokens and the emitted tokens are the output less the prefill's token
    steps = sum(p["verifications"] for p in report["prompts"])
    emitted = sum(p["new_tokens"] - 1 for p in report["prompts"])
    assert report["acceptance_length"] == pytest.approx(emitted / steps)
    assert report["sim_accept_len"] == 1.7  # the last *eval* line, not the later train line
    assert report["sim_accept_len_k"] == pytest.approx(1 + 0.5 + 0.5 * 0.4)  # its acc_0, acc_1 over k=3 steps


def test_both_decodes_run_at_one_named_precision(tiny_llama_dir, tiny_draft, prompts, tmp_path):
    """bf16 forced (the slow path on an AVX2-only CPU; short on the tiny model): the baseline and the speculative
    decode run the one bf16 target, so the lossless check compares like with like, and report.json says so."""
    from eagle3.devices import resolve_precision

    for precision in ("bfloat16", "auto"):
        cfg = EvaluateConfig(model=tiny_llama_dir, draft=tiny_draft, out=str(tmp_path / precision), prompts=prompts,
                             limit=2, max_new_tokens=12, device="cpu", precision=precision)
        summary = evaluate(cfg)
        report = json.loads((tmp_path / precision / "report.json").read_text())
        want = resolve_precision(precision, "cpu", workload="decode")  # the policy's choice for batch-1 decoding
        assert report["precision"] == summary["precision"] == want.to_dict()
        assert report["dtype"] == want.name and report["lossless"] is True


def test_a_mismatch_message_names_the_prompt_and_its_fp32_margin():
    from eagle3.errors import GateFailed
    from eagle3.evaluate.gate import gate

    def report(precision, **rescored):
        return {"prompts": [{"id": "p1", "lossless": False, "mismatch": {"position": 3, "baseline_token": 7,
                                                                          "speculative_token": 9, **rescored}},
                            {"id": "p2", "lossless": True, "tie_flip": {"position": 5}}],
                "precision": {"name": precision}, "device": "cpu"}

    with pytest.raises(GateFailed, match=r"(?s)transformers: speculative output differs from the baseline on 1 "
                                         r"prompt\(s\):\n  prompt p1: first difference at generated position 3 "
                                         r"\(baseline token 7, speculative token 9\); fp32 margin 1.2500 is beyond "
                                         r"the 0.0400 that rounding can flip \(fp32 argmax 7\).*re-scored"):
        gate({"transformers": report("bfloat16", margin_fp32=1.25, tolerance=0.04, fp32_argmax=7)}, "r.json")
    with pytest.raises(GateFailed) as e:
        gate({"vllm": report("float32")}, "r.json")
    assert "vllm:" in str(e.value) and "p2" not in str(e.value)  # a tie flip is no failure


def test_evaluate_reports_each_prompt_set(tiny_llama_dir, tiny_draft, prompts, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "Name a colour."}) + "\n")
    cfg = EvaluateConfig(model=tiny_llama_dir, draft=tiny_draft, out=str(tmp_path / "eval"),
                         prompts=f"{prompts},{other}", limit=2, max_new_tokens=12, device="cpu")
    evaluate(cfg)
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["set_order"] == [prompts, str(other)] and report["primary_set"] == prompts
    from eagle3.acceptance import ordered_sets
    assert [name for name, _ in ordered_sets(report)] == [prompts, str(other)]  # keys are sorted on disk
    assert [p["set"] for p in report["prompts"]] == [prompts, prompts, str(other)]
    for name, s in report["sets"].items():
        rows = [p for p in report["prompts"] if p["set"] == name]
        steps = sum(p["verifications"] for p in rows)
        assert s["acceptance_length"] == pytest.approx(sum(p["new_tokens"] - 1 for p in rows) / steps)
        assert s["num_prompts"] == len(rows)
    # the headline figures are the first set's, not a mix of both
    assert report["acceptance_length"] == report["sets"][prompts]["acceptance_length"]
    assert report["num_prompts"] == 2


def test_evaluate_fails_loudly_on_a_mismatch(tiny_llama_dir, tiny_draft, prompts, tmp_path, monkeypatch):
    from eagle3.evaluate import spec_decode

    real = spec_decode.speculative_generate

    def corrupt(*a, **kw):  # a decoder bug: the 4th generated token is wrong
        gen = real(*a, **kw)
        gen.tokens[3] = (gen.tokens[3] + 1) % 49152
        return gen

    monkeypatch.setattr(spec_decode, "speculative_generate", corrupt)
    out = tmp_path / "eval"
    with pytest.raises(GateFailed, match=r"prompt chat.jsonl:1: first difference at generated position 3"):
        evaluate(EvaluateConfig(model=tiny_llama_dir, draft=tiny_draft, out=str(out), prompts=prompts, limit=1,
                                max_new_tokens=8, device="cpu"))
    report = json.loads((out / "report.json").read_text())  # written before failing
    assert report["lossless"] is False and report["prompts"][0]["mismatch"]["position"] == 3
    rc = main(["evaluate", "--target", tiny_llama_dir, "--draft", tiny_draft, "--prompts", prompts,
               "--limit", "1", "--max-new-tokens", "8", "--device", "cpu", "--out", str(out)])
    assert rc == 3


def test_cli_prints_tau_speedup_and_verdict(tiny_llama_dir, tiny_draft, prompts, tmp_path, capsys):
    rc = main(["evaluate", "--target", tiny_llama_dir, "--draft", tiny_draft, "--prompts", prompts, "--limit", "1",
               "--max-new-tokens", "6", "--steps", "2", "--device", "cpu", "--out", str(tmp_path / "e")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tau " in out and "(k=2)" in out and "lossless=True" in out


def test_offline_sim_accept_len_takes_the_last_eval_line(tmp_path):
    lines = [{"event": "eval", "step": 1, "sim_accept_len": 1.2, "acc_i": [0.2]},
             {"event": "eval", "step": 2, "sim_accept_len": 1.5, "acc_i": [0.5]},
             {"event": "train", "step": 3, "sim_accept_len": 1.9, "acc_i": [0.9]}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = offline_sim_accept_len(str(tmp_path))
    assert got == {"sim_accept_len": 1.5, "step": 2, "acc": [0.5]}
    (tmp_path / "no-eval").mkdir()
    (tmp_path / "no-eval" / "metrics.jsonl").write_text(json.dumps(lines[2]) + "\n")  # trained with eval_every 0
    assert offline_sim_accept_len(str(tmp_path / "no-eval")) is None


def test_the_report_counts_the_answer_tokens_outside_the_draft_vocab(tiny_llama_dir, make_draft, prompts,
                                                                      tmp_path):
    from safetensors.numpy import load_file

    from eagle3.target import vocab_size

    v = vocab_size(tiny_llama_dir)
    draft = make_draft(tiny_llama_dir, tmp_path / "draft", vd=v // 4, aux=[1, 3, 4])
    cfg = EvaluateConfig(model=tiny_llama_dir, draft=draft, out=str(tmp_path / "eval"), prompts=prompts,
                         limit=2, max_new_tokens=16, device="cpu", precision="float32")
    summary = evaluate(cfg)
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    # fp32: the speculative output is the baseline's token for token, so it is the target's answer
    assert all(p["exact"] for p in report["prompts"])
    # the oracle is the export's t2d mask, not the d2t map the decoder reads
    t2d = load_file(str(tmp_path / "draft" / "model.safetensors"))["t2d"]
    answers = [p["token_ids"] for p in report["prompts"]]
    outside = sum(not t2d[t] for a in answers for t in a)
    name = report["primary_set"]
    reach = report["sets"][name]["vocab_reach"]
    assert reach["tokens"] == sum(map(len, answers)) == 32 and reach["outside"] == outside > 0
    assert reach["draft_vocab_size"] == v // 4 and report["vocab_reach"] == reach
    assert f"answer tokens: {100 * (1 - outside / 32):.1f}% on {name}" in say(cfg, summary)


def test_a_wrong_checkpoint_fails_before_any_decoding(tmp_path, monkeypatch):
    from eagle3.errors import InputError
    from eagle3.evaluate import decoder_bench

    monkeypatch.setattr(decoder_bench, "_load", lambda *a: pytest.fail("the target was loaded"))
    cfg = EvaluateConfig(model="smollm2-135m-instruct", draft=str(tmp_path / "draft"), out=str(tmp_path / "eval"),
                         prompts="chat", limit=1, checkpoint=str(tmp_path / "ckpt-typo"))
    with pytest.raises(InputError, match=r"ckpt-typo: no metrics.jsonl here: --checkpoint names the train stage's"):
        decoder_bench.measure(cfg)
