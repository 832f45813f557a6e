"""The publish gate's decisions, on a local registry and on a real S3 endpoint (moto server)."""

from __future__ import annotations

import json

import pytest

from eagle3 import storage
from eagle3.cli import main
from eagle3.publish import PublishConfig, publish, read_registry
from eagle3.errors import InputError


def _eval(root, name, tau, spec=120.0, base=90.0, lossless=True, weights=b"w", prompts="humaneval", **extra):
    """An EVAL/report.json and a DRAFT folder (distinct weights per draft)."""
    report = storage.join(root, name, "eval", "report.json")
    storage.write_json(report, {"acceptance_length": tau, "lossless": lossless, "tokens_per_s_spec": spec,
                                "tokens_per_s_base": base, "speedup": spec / base, "steps": 3,
                                "accept_rate_by_position": [0.7, 0.6, 0.5], "prompts_source": prompts,
                                "max_new_tokens": 64, "target": "smollm2-135m-instruct", "num_prompts": 20,
                                "proposer": "draft", "backend": "transformers",
                                "precision": {"name": "float32", "reason": "test"}, **extra})
    draft = storage.join(root, name, "draft")
    storage.write_bytes(storage.join(draft, "model.safetensors"), weights + name.encode())
    storage.write_json(storage.join(draft, "config.json"), {"architectures": ["LlamaForCausalLMEagle3"]})
    return report, draft


def _sequence(root, registry):
    r1, d1 = _eval(root, "first", 2.1)
    first = publish(PublishConfig(r1, d1, registry, run_id="run/1"))
    assert first["published"] and ("first draft published on this benchmark (humaneval (20 prompts), k=3, 64 new "
                                    "tokens, transformers in float32, proposer draft") in first["reason"]
    assert storage.list_files(first["location"]) == ["config.json", "model.safetensors"]
    assert storage.read_bytes(storage.join(first["location"], "model.safetensors")) == b"wfirst"

    r2, d2 = _eval(root, "worse", 2.0)
    worse = publish(PublishConfig(r2, d2, registry))
    assert not worse["published"] and worse["location"] is None
    assert "does not beat the previous best 2.100" in worse["reason"]
    assert worse["compared"]["previous_best"]["acceptance_length"] == 2.1

    r3, d3 = _eval(root, "slow", 3.0, spec=80.0, base=90.0)
    slow = publish(PublishConfig(r3, d3, registry))
    assert not slow["published"] and "not faster than the baseline: transformers 80.00 vs 90.00" in slow["reason"]

    r4, d4 = _eval(root, "lossy", 3.5, lossless=False)
    lossy = publish(PublishConfig(r4, d4, registry))
    assert not lossy["published"] and "not lossless" in lossy["reason"]

    r5, d5 = _eval(root, "better", 2.6)
    better = publish(PublishConfig(r5, d5, registry))
    assert better["published"] and "beats the previous best τ 2.100" in better["reason"]
    assert better["compared"]["previous_best"]["id"] == first["entry_id"]

    doc = read_registry(registry)
    assert [e["published"] for e in doc["entries"]] == [True, False, False, False, True]
    assert doc["best"] == better["entry_id"]
    # the decision is also written next to the report, for the run report
    assert storage.read_json(storage.join(root, "better", "eval", "publish.json"))["published"] is True
    # a retried task with the same weights does not publish twice
    again = publish(PublishConfig(r5, d5, registry))
    assert again["published"] and "already published" in again["reason"]
    assert len(read_registry(registry)["entries"]) == 5


def test_publish_decisions_local(tmp_path):
    _sequence(str(tmp_path / "runs"), str(tmp_path / "registry"))


def test_publish_decisions_on_s3(s3_bucket):
    _sequence(f"{s3_bucket}/runs", f"{s3_bucket}/registry")
    assert any(k.startswith("drafts/") for k in storage.list_files(f"{s3_bucket}/registry"))


def test_publish_refuses_a_report_without_metrics(tmp_path):
    storage.write_json(str(tmp_path / "report.json"), {"acceptance_length": 2.0})
    with pytest.raises(InputError, match="lacks lossless"):
        publish(PublishConfig(str(tmp_path / "report.json"), str(tmp_path), str(tmp_path / "reg")))


def test_publish_cli(tmp_path, capsys):
    report, draft = _eval(str(tmp_path), "a", 2.4)
    assert main(["publish", "--report", report, "--draft", draft, "--registry", str(tmp_path / "reg")]) == 0
    out = capsys.readouterr().out
    assert "PUBLISHED to" in out
    assert json.loads((tmp_path / "reg" / "registry.json").read_text())["entries"][0]["acceptance_length"] == 2.4


def test_tau_is_compared_only_on_the_same_benchmark(tmp_path):
    root, registry = str(tmp_path), str(tmp_path / "registry")
    r1, d1 = _eval(root, "chat-draft", 3.2, prompts="chat")
    assert publish(PublishConfig(r1, d1, registry))["published"]
    # a HumanEval τ of 2.0 is not "worse" than a chat τ of 3.2: different prompts, not comparable
    r2, d2 = _eval(root, "code-draft", 2.0)
    code = publish(PublishConfig(r2, d2, registry))
    assert code["published"] and "first draft published on this benchmark (humaneval" in code["reason"]
    assert "1 draft(s) published on other benchmarks were not compared" in code["reason"]
    assert code["compared"]["previous_best"] is None and code["compared"]["benchmark"]["prompts_source"] == "humaneval"
    r3, d3 = _eval(root, "code-worse", 1.9)
    worse = publish(PublishConfig(r3, d3, registry))
    assert not worse["published"] and "does not beat the previous best 2.000" in worse["reason"]
    assert read_registry(registry)["best"] == code["entry_id"]


def _engines(decoder: tuple[float, float], vllm: tuple[float, float]) -> dict:
    return {"engines": {"transformers": {"tau": 2.1, "tokens_per_s_spec": decoder[0], "tokens_per_s_base": decoder[1],
                                         "speedup": decoder[0] / decoder[1], "precision": "float32"},
                        "vllm": {"tau": 2.1, "tokens_per_s_spec": vllm[0], "tokens_per_s_base": vllm[1],
                                 "speedup": vllm[0] / vllm[1], "precision": "float32"}}}


def test_the_speed_gate_reads_the_serving_engine_and_engines_that_disagree_are_refused(tmp_path):
    """A draft is shipped to vLLM: the speed gate reads vLLM's figures where evaluate measured them (an AVX2 demo
    ran 0.93x in the project decoder and 1.16x in vLLM and was not published). Engines that disagree on τ beyond
    what the prompts allow are a convention mismatch: the draft would not serve at the τ measured."""
    root, registry = str(tmp_path / "runs"), str(tmp_path / "registry")
    r, d = _eval(root, "served", 2.1, spec=90.0, base=100.0, **_engines((90.0, 100.0), (116.0, 100.0)))
    served = publish(PublishConfig(r, d, registry))
    assert served["published"] and "speculation is faster (vllm 116.00 vs 100.00 tok/s)" in served["reason"]
    entry = read_registry(registry)["entries"][-1]
    assert entry["engines"]["vllm"]["speedup"] == pytest.approx(1.16)
    r, d = _eval(root, "slow-in-vllm", 2.5, spec=130.0, base=100.0, **_engines((130.0, 100.0), (95.0, 100.0)))
    assert "not faster than the baseline: vllm 95.00 vs 100.00" in publish(PublishConfig(r, d, registry))["reason"]
    mismatch = {"vllm": {"against": "transformers", "prompts": 20, "agree": False,
                         "tau": {"difference": -0.114, "interval": [-0.2, -0.05], "agree": False}}}
    r, d = _eval(root, "mismatch", 2.6, agreement=mismatch, **_engines((120.0, 100.0), (130.0, 100.0)))
    refused = publish(PublishConfig(r, d, registry))
    assert not refused["published"]
    assert "vllm and transformers disagree on τ by -0.114 (interval [-0.200, -0.050] over 20 prompts)" in \
        refused["reason"]


def test_the_engine_refusal_names_the_prompts_its_interval_is_over(tmp_path):
    """The agreement as evaluate writes it (eagle3.evaluate.compare.combine), not a hand-made dict: the paired
    interval is over the prompts both engines decoded alike (`prompts`: 4 here), not all compared (6)."""
    from eagle3.evaluate.compare import combine

    def engine(emitted: int, differs_from: int) -> dict:
        rows = [{"set": "humaneval", "id": str(i), "token_ids": [i] if i < differs_from else [-i],
                 "counts": {"verifications": 10, "emitted": emitted + i % 2, "reached": [10, 8, 6],
                            "accepted": [8, 6, 4]}} for i in range(6)]
        return {"primary_set": "humaneval", "prompts": rows, "tokens_per_s_spec": 130.0, "tokens_per_s_base": 100.0,
                "speedup": 1.3, "lossless": True, "precision": {"name": "float32"}}

    agreement = combine({"transformers": engine(30, 6), "vllm": engine(20, 4)}, "transformers")["agreement"]
    assert (agreement["vllm"]["prompts"], agreement["vllm"]["prompts_compared"]) == (4, 6)
    root, registry = str(tmp_path / "runs"), str(tmp_path / "registry")
    r, d = _eval(root, "mismatch", 2.6, agreement=agreement, **_engines((120.0, 100.0), (130.0, 100.0)))
    refused = publish(PublishConfig(r, d, registry))
    assert not refused["published"] and "(interval [+1.000, +1.000] over 4 prompts)" in refused["reason"]


@pytest.mark.parametrize("changed", [{"num_prompts": 5}, {"proposer": "lookup+draft"}, {"backend": "vllm"},
                                     {"precision": {"name": "bfloat16"}}])
def test_tau_measured_another_way_is_not_compared(tmp_path, changed):
    """τ moves with the prompt subset, a prompt lookup in front of the draft, the engine and the precision: a draft
    measured another way starts a benchmark of its own instead of knocking out (or losing to) the best."""
    root, registry = str(tmp_path / "runs"), str(tmp_path / "registry")
    r1, d1 = _eval(root, "first", 2.5)
    assert publish(PublishConfig(r1, d1, registry))["published"]
    r2, d2 = _eval(root, "other", 2.0, **changed)
    other = publish(PublishConfig(r2, d2, registry))
    assert other["published"] and "first draft published on this benchmark" in other["reason"]
