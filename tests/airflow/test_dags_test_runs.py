"""Whole-DAG runs with real `airflow dags test` on a tiny random target:
OOM retries that resume with an adapted batch (offline and online training), bad
input that fails without a retry, and a re-run on changed data that redoes only what changed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.airflow.conftest import airflow, airflow_env
from tests.airflow.tiny_data import tiny_conf, write_dataset, write_tiny_manifest

pytestmark = [pytest.mark.integration]


def dags_test(home: Path, conf: dict, **env: str):
    env = airflow_env(home, EAGLE3_RETRY_DELAY_S="1", EAGLE3_OOM_RETRY_DELAY_S="1", **env)
    return airflow(home, "dags", "test", "eagle3_train", "-c", json.dumps(conf), env=env, check=False,
                   timeout=1200)


def task_instances(home: Path, run_id: str | None = None) -> dict[tuple[str, int], tuple[str, int]]:
    """(task_id, map_index) -> (state, try_number) of the newest run."""
    db = sqlite3.connect(home / "airflow.db")
    if run_id is None:
        run_id = db.execute("SELECT run_id FROM dag_run WHERE dag_id='eagle3_train' ORDER BY id DESC LIMIT 1"
                            ).fetchone()[0]
    rows = db.execute("SELECT task_id, map_index, state, try_number FROM task_instance "
                      "WHERE dag_id='eagle3_train' AND run_id=?", (run_id,)).fetchall()
    return {(t, m): (s, n) for t, m, s, n in rows}


def newest_run_dir(root: Path) -> Path:
    return max((root / "runs" / "eagle3_train").iterdir(), key=lambda p: p.stat().st_mtime)


def test_injected_oom_retries_once_and_resumes_with_half_batch(airflow_home, tmp_path, tiny_llama_dir):
    manifest = write_tiny_manifest(tmp_path / "data")
    root = tmp_path / "artifacts"
    # A P-EAGLE draft (the parallel_drafting Param): the setting survives the OOM resume into the export.
    conf = tiny_conf(manifest, tiny_llama_dir, str(root), token_budget=512, extract_shards=1, parallel_drafting=True)
    proc = dags_test(airflow_home, conf, EAGLE3_INJECT_OOM_ABOVE_TOKENS="300")
    tis = task_instances(airflow_home)
    assert tis[("extract", 0)] == ("success", 2), (tis, proc.stdout[-3000:])
    assert tis[("train", -1)] == ("success", 2), (tis, proc.stdout[-3000:])
    assert tis[("evaluate", -1)][0] == "success", tis
    run = newest_run_dir(root)
    state = json.loads((run / "checkpoint" / "latest.json").read_text())
    train_state = json.loads((run / "checkpoint" / state["dir"] / "train_state.json").read_text())
    assert train_state["token_budget"] == 256 and train_state["grad_accum"] == 2, train_state
    draft_cfg = json.loads((run / "checkpoint" / state["dir"] / "config.json").read_text())
    assert draft_cfg.get("draft", draft_cfg)["parallel_drafting"] is True, draft_cfg
    assert json.loads((run / "draft" / "config.json").read_text())["parallel_drafting"] is True
    assert json.loads((run / "eval" / "report.json").read_text())["lossless"] is True
    # The Params' defaults (the demo's) give the run 780 s, 270 of them kept after train at 750 tok/s of
    # extraction: the tiny target extracted far faster, so the reserve shrank to its floor (half), and the tiny run
    # reached train within a few minutes, so its 150-s budget was stretched to that deadline (max_steps ends it).
    from eagle3.demo.settings import PARAMS
    from eagle3.train.budget import RESERVE_FLOOR, extraction_rate, scaled_reserve

    shards = [json.loads(p.read_text()) for p in (run / "summaries").glob("extract.*.json")]
    rate = extraction_rate(shards)
    kept = scaled_reserve(PARAMS["after_train_reserve"], PARAMS["reserve_tokens_per_s"], rate)
    assert PARAMS["run_time_budget"] == 780 and PARAMS["after_train_reserve"] == 270 and rate > 2 * 750, shards
    assert kept == 270 * RESERVE_FLOOR
    assert f"this run extracted at {rate:.0f} tok/s: {kept:.0f} s kept" in proc.stdout  # the train task's log
    budget = json.loads((run / "summaries" / "train.json").read_text())["budget"]
    assert 150 < budget["seconds"] <= 780 - kept, budget


def test_bad_input_fails_once_without_retry(airflow_home, tmp_path, tiny_llama_dir):
    manifest = write_tiny_manifest(tmp_path / "data")
    bad = tmp_path / "data" / "beta.jsonl"
    bad.write_text("".join("{not json\n" for _ in range(20)))
    conf = tiny_conf(manifest, tiny_llama_dir, str(tmp_path / "artifacts"))
    dags_test(airflow_home, conf)
    tis = task_instances(airflow_home)
    assert tis[("tokenize", 1)] == ("failed", 1), tis
    assert tis[("tokenize", 0)][0] == "success"
    assert tis[("merge", -1)][0] == "upstream_failed"
    rejects = (tmp_path / "artifacts" / "prepared" / "beta" / "rejects.jsonl").read_text().splitlines()
    assert len(rejects) == 20 and json.loads(rejects[0])["line"] == 1


def test_rerun_redoes_only_what_changed(airflow_home, tmp_path, tiny_llama_dir):
    manifest = write_tiny_manifest(tmp_path / "data", n_per_dataset=30)
    root = tmp_path / "artifacts"
    conf = tiny_conf(manifest, tiny_llama_dir, str(root))
    dags_test(airflow_home, conf)
    first = task_instances(airflow_home)
    assert first[("report", -1)][0] == "success", first
    # A first publish into an empty registry of a lossless draft publishes exactly when speculation was faster
    # than the baseline. On this CPU that is a measurement of the tiny random draft, not a setting: the expected
    # outcome is computed from evaluate's own figures, and each outcome is asserted exactly (the state, the
    # decision, its reason to the letter).
    ev = json.loads((newest_run_dir(root) / "eval" / "report.json").read_text())
    decision = json.loads((newest_run_dir(root) / "summaries" / "publish.json").read_text())
    assert ev["lossless"] is True, ev.get("lossless_verdict")
    spec, base, tau = ev["tokens_per_s_spec"], ev["tokens_per_s_base"], ev["acceptance_length"]
    faster = spec > base
    assert (first[("publish", -1)][0], decision["published"]) == ("success" if faster else "skipped", faster), \
        (first, decision, spec, base)
    benchmark = (f"{ev['prompts_source']} ({ev['num_prompts']} prompts), k={ev['steps']}, {ev['max_new_tokens']} new "
                 f"tokens, transformers in {ev['precision']['name']}, proposer draft, target {ev['target']}")
    assert decision["reason"] == (  # no engine compared: the speed of the headline engine, the project decoder
        f"τ {tau:.3f} is the first draft published on this benchmark ({benchmark}), and speculation is faster "
        f"(transformers {spec:.2f} vs {base:.2f} tok/s)" if faster else
        f"speculation is not faster than the baseline: transformers {spec:.2f} vs {base:.2f} tok/s"), decision
    first_extract = json.loads((newest_run_dir(root) / "report" / "reuse.json").read_text())
    assert first_extract["extracted_samples"] > 0

    write_dataset(tmp_path / "data" / "beta.jsonl", 40, seed=2)  # 30 old conversations + 10 new
    dags_test(airflow_home, conf)
    second = task_instances(airflow_home)
    assert second[("report", -1)][0] == "success", second
    reuse = json.loads((newest_run_dir(root) / "report" / "reuse.json").read_text())
    assert reuse["tokenize"] == {"alpha": "reused", "beta": "tokenized"}, reuse
    assert reuse["extracted_samples"] == 10, reuse


def test_online_mode_skips_extract_and_retries_an_oom_in_train(airflow_home, tmp_path, tiny_llama_dir):
    """training_mode=online through the real DAG: verify records the choice and both costs, extract maps over
    no shard, train runs the target itself, hits the injected OOM, and resumes with half the batch."""
    manifest = write_tiny_manifest(tmp_path / "data")
    root = tmp_path / "artifacts"
    conf = {**tiny_conf(manifest, tiny_llama_dir, str(root), token_budget=512, extract_shards=1),
            "training_mode": "online"}
    proc = dags_test(airflow_home, conf, EAGLE3_INJECT_OOM_ABOVE_TOKENS="300")
    tis = task_instances(airflow_home)
    assert tis[("train", -1)] == ("success", 2), (tis, proc.stdout[-3000:])
    assert tis[("evaluate", -1)][0] == "success", tis
    assert not [k for k in tis if k[0] == "extract" and tis[k][0] == "success"], tis  # nothing extracted
    run = newest_run_dir(root)
    verdict = json.loads((run / "merged" / "verify.json").read_text())["training_mode"]
    assert verdict["mode"] == "online" and verdict["requested"] == "online", verdict
    assert verdict["costs"]["online"]["bytes"] == 0 < verdict["costs"]["offline"]["bytes"]
    assert not (root / "store").exists() or not any((root / "store").rglob("*.safetensors"))
    state = json.loads((run / "checkpoint" / "latest.json").read_text())
    train_state = json.loads((run / "checkpoint" / state["dir"] / "train_state.json").read_text())
    assert train_state["token_budget"] == 256 and train_state["grad_accum"] == 2, train_state
    metrics = [json.loads(x) for x in (run / "checkpoint" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [m for m in metrics if m.get("event") == "train"]
    assert steps and all(m["mode"] == "online" and m["online"] for m in steps), steps[:1]
