"""bench/paired_bench.py's bookkeeping: what the second draft changes, which evaluation may be reused, and the
paired figures (hand-computed counts); the whole bench runs in `make demo --compare` (README "The demo")."""

from __future__ import annotations

import json

import pytest

from bench import paired_bench as pb


def _inputs(**kw) -> dict:
    tc = {"model": "m", "merged": "/r/merged", "store": "/root/store", "out": "/r/checkpoint", "draft_variant": "eagle3",
          "train_time_budget": 150.0, "train_deadline": 1.7e9, "max_steps": 0, "epochs": 3, "warmup_ratio": 0.03,
          "seed": 7, "lr": 2e-3}
    return {"train_config": tc, "steps": 208, "warmup": 5, "epoch": 2, "draft_variant": "eagle3",
            "target_engine": "transformers", "engines": {"transformers": 100},
            "store": {"aux_layers": [1, 14, 26], "storage_option": "bf16", "precision": {"name": "bfloat16"}},
            "budgeted": False, **kw}


def test_the_second_draft_changes_one_setting_and_keeps_the_schedule(tmp_path):
    variant = pb.retrain_config(_inputs(), "draft_variant", "eagle3.1", str(tmp_path))
    engine = pb.retrain_config(_inputs(), "target_engine", "vllm", str(tmp_path))
    seed = pb.retrain_config(_inputs(), "seed", pb.other_value("seed", 7), str(tmp_path))
    assert (seed["seed"], seed["draft_variant"], seed["store"]) == (8, "eagle3", "/root/store")
    for tc in (variant, engine, seed):
        # exactly the run's steps and warm-up, not re-timed; enough epochs planned for them
        assert (tc["max_steps"], tc["train_time_budget"], tc["train_deadline"], tc["epochs"]) == (208, 0.0, 0.0, 4)
        assert tc["warmup_ratio"] * 208 == pytest.approx(5)
        assert (tc["lr"], tc["merged"]) == (2e-3, "/r/merged")
        assert tc["out"] == str(tmp_path / "checkpoint")
    assert (variant["draft_variant"], variant["store"], variant["seed"]) == ("eagle3.1", "/root/store", 7)
    assert (engine["draft_variant"], engine["store"], engine["seed"]) == ("eagle3", str(tmp_path / "store"), 7)
    assert "schedule_from" not in variant  # an epochs-based run: its cosine over its steps, capped
    # A time-budgeted run's curve (squeezed at its refit and re-plans) is replayed from its checkpoint.
    layout = type("Layout", (), {"folder": staticmethod(lambda name: f"/r/{name}")})()
    budgeted = pb.retrain_config(_inputs(budgeted=True, layout=layout), "draft_variant", "eagle3.1", str(tmp_path))
    assert budgeted["schedule_from"] == "/r/checkpoint" and budgeted["train_time_budget"] == 0.0


def test_p_eagle_pairs_against_the_chain_and_prints_both_speed_ups(tmp_path):
    inputs = _inputs(parallel_drafting=False)
    other = pb.other_value("parallel_drafting", inputs["parallel_drafting"])
    tc = pb.retrain_config(inputs, "parallel_drafting", other, str(tmp_path))
    assert (tc["parallel_drafting"], tc["draft_variant"], tc["store"], tc["max_steps"]) == (True, "eagle3",
                                                                                            "/root/store", 208)
    assert (pb.label("parallel_drafting", False), pb.label("parallel_drafting", True)) == ("chain", "parallel")
    base = {"primary_set": "humaneval", "lossless": True, "speedup": 1.5, "prompts": [_prompt(0, 20, 10, [1])]}
    changed = {"primary_set": "humaneval", "lossless": True, "speedup": 1.6, "prompts": [_prompt(0, 20, 12, [1])]}
    out = {"vary": "parallel_drafting", "base": False, "changed": True, "steps": 208,
           "benchmark": {"prompts": "humaneval", "steps": 3},
           **pb.compare(base, changed, "chain", "parallel")}
    line = pb.summary_line(out)
    assert "tau chain 2.000, parallel 1.667" in line and "chain 1.50x, parallel 1.60x" in line, line


def test_an_online_run_trains_online_from_the_other_engine(tmp_path):
    inputs = _inputs()
    inputs["train_config"].update(online=True, target_engine="transformers", write_back=True)
    tc = pb.retrain_config(inputs, "target_engine", "vllm", str(tmp_path))
    assert (tc["online"], tc["target_engine"], tc["write_back"], "store" in tc) == (True, "vllm", False, False)


def test_the_other_engine_extracts_with_the_run_stores_layers_option_and_precision(tmp_path):
    args = pb.extract_args(_inputs(), "vllm", str(tmp_path))
    assert args == ["extract", "--merged", "/r/merged", "--model", "m", "--out", str(tmp_path / "store"),
                    "--engine", "vllm", "--aux-layers", "1,14,26", "--storage-option", "bf16", "--precision",
                    "bfloat16"]
    with pytest.raises(SystemExit, match="needs a run that trained offline"):
        pb.extract_args(_inputs(store=None), "vllm", str(tmp_path))


def _report(tmp_path, name: str, **kw) -> None:
    eval_dir = tmp_path / "root" / "runs" / "eagle3_train" / "run1" / "eval"
    eval_dir.mkdir(parents=True, exist_ok=True)
    report = {"backend": "vllm", "prompts_source": "humaneval", "num_prompts": 5, "steps": 3, "max_new_tokens": 64,
              "prompts": [], **kw}
    (eval_dir / name).write_text(json.dumps(report))


def test_the_runs_own_vllm_evaluation_is_reused_only_for_the_same_benchmark(tmp_path):
    run = str(tmp_path / "root" / "runs" / "eagle3_train" / "run1")
    _report(tmp_path, "report.json", backend="transformers")  # the project decoder's: never stands for vLLM
    assert pb.reusable_report(run, "humaneval", 5, 3, 64) is None
    _report(tmp_path, "vllm_report.json")
    assert pb.reusable_report(run, "humaneval", 5, 3, 64)["backend"] == "vllm"
    for other in (("chat", 5, 3, 64), ("humaneval", 10, 3, 64), ("humaneval", 5, 4, 64), ("humaneval", 5, 3, 32)):
        assert pb.reusable_report(run, *other) is None


def _prompt(i: int, emitted: int, verifications: int, ids: list[int]) -> dict:
    return {"id": f"p{i}", "set": "humaneval", "token_ids": ids,
            "counts": {"verifications": verifications, "emitted": emitted, "reached": [verifications],
                       "accepted": [emitted - verifications]}}


def test_paired_figures_by_hand():
    base = {"primary_set": "humaneval", "lossless": True,
            "prompts": [_prompt(0, 20, 10, [1]), _prompt(1, 30, 20, [2])]}
    changed = {"primary_set": "humaneval", "lossless": True,
               "prompts": [_prompt(0, 20, 8, [1]), _prompt(1, 30, 15, [3])]}
    out = pb.compare(base, changed, "eagle3", "eagle3.1")
    # tau = sum emitted / sum verifications: 50/30 and 50/23
    assert out["tau"] == {"eagle3": pytest.approx(50 / 30), "eagle3.1": pytest.approx(50 / 23)}
    assert out["difference"]["difference"] == pytest.approx(50 / 23 - 50 / 30)
    assert out["same_greedy_output"] == 1 and out["prompts"] == 2
    other = {**changed, "prompts": changed["prompts"][::-1]}
    with pytest.raises(SystemExit, match="different prompts"):
        pb.compare(base, other, "eagle3", "eagle3.1")


def test_a_run_from_before_the_rename_is_read_under_the_new_names(tmp_path, tiny_llama_dir):
    """A finished run of an older release: its train_state.json's train_config and its store's store.json spell
    ``layers``/``storage``. The bench reads both under the new names and extracts with the new flags."""
    from eagle3 import checkpoint
    from eagle3.extract.store import StoreWriter
    from eagle3.target import model_fingerprint

    run = tmp_path / "root" / "runs" / "eagle3_train" / "run1"
    old_tc = {**_inputs()["train_config"], "model": tiny_llama_dir, "store": str(tmp_path / "store"),
              "vocab": "/r/vocab", "layers": [1, 3, 4], "storage": "fp8"}
    checkpoint.save(str(run / "checkpoint"), 208, {}, {}, {"train_config": old_tc, "total_steps": 208,
                                                              "position": {"epoch": 2}}, {"variant": "eagle3"})
    (run / "summaries").mkdir(parents=True)
    (run / "summaries" / "train.json").write_text(json.dumps({"engines": {"transformers": 100}}))
    writer = StoreWriter(str(tmp_path / "store"), model_fp=model_fingerprint(tiny_llama_dir), model_name="m",
                         aux_layers=[1, 3, 4], hidden_size=64, vocab_size=100, storage_option="fp8", task="0of1",
                         precision={"name": "float32"}).open()
    store_json = tmp_path / "store" / writer.uri.rsplit("/", 1)[1] / "store.json"
    info = json.loads(store_json.read_text())
    info["layers"], info["storage"] = info.pop("aux_layers"), info.pop("storage_option")
    store_json.write_text(json.dumps(info))
    with pytest.warns(DeprecationWarning) as recorded:
        inputs = pb.run_inputs(str(run))
    said = [str(w.message).split(" is deprecated")[0] for w in recorded if w.category is DeprecationWarning]
    state = run / "checkpoint" / "step-00000208" / "train_state.json"
    assert said == [f"{state} train_config: layers", f"{state} train_config: storage", f"{store_json}: layers",
                    f"{store_json}: storage"]
    assert (inputs["train_config"]["aux_layers"], inputs["train_config"]["storage_option"]) == ([1, 3, 4], "fp8")
    assert not {"layers", "storage"} & set(inputs["train_config"])
    assert pb.extract_args(inputs, "vllm", str(tmp_path / "w"))[-6:] == [
        "--aux-layers", "1,3,4", "--storage-option", "fp8", "--precision", "float32"]


def test_the_demo_sets_a_difference_against_the_seed_pairs():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
    import run_demo

    res = lambda d: {"difference": {"difference": d}}  # noqa: E731
    assert run_demo.against_noise({"target_engine": res(0.2)}) == []  # no seed pair, no verdict
    within, beyond = (run_demo.against_noise({"seed": res(-0.081), "target_engine": res(d)}) for d in (0.058, 0.1))
    assert within == ["target_engine: tau difference +0.058; two seeds of the run's own settings differ by 0.081, "
                      "so it is within training noise"]
    assert beyond[0].endswith("larger than that one seed pair's difference (a rough yardstick: one pair)")
