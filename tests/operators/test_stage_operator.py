"""The one operator shape: Eagle3StageOperator builds the stage's Config and makes one core call.

In-process and subprocess stages report back the same way (the run layout's summaries folder, XCom when
small). The SGLang paths run as operators against a fake `sglang.launch_server` that speaks SGLang's
documented endpoints (tests/evaluate/fake_sglang_server.py); it logs its argv and pid, so a test can check
that no server outlives its task, also when the task is killed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3.errors import InputError
from operators.stage import Eagle3StageOperator, RegenerateOperator
from tests.evaluate.server_processes import alive

FAKE_DIR = Path(__file__).resolve().parents[1] / "evaluate"


def context(map_index: int = -1) -> dict:
    return {"ti": SimpleNamespace(map_index=map_index), "dag": SimpleNamespace(dag_id="dag"), "run_id": "run1"}


@pytest.fixture
def fake_sglang(monkeypatch, tmp_path):
    """Servers that stages start run the fake module; returns the argv log path."""
    argv_log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("EAGLE3_SGLANG_MODULE", "fake_sglang_server")
    monkeypatch.setenv("FAKE_SGLANG_ARGV_LOG", str(argv_log))
    return argv_log


def _runs(argv_log: Path) -> list[dict]:
    return [json.loads(x) for x in argv_log.read_text().splitlines()] if argv_log.exists() else []


def _manifest(tmp_path, regenerate: bool = False) -> str:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                                     {"role": "assistant", "content": "old"}]}) + "\n"
                            for i in range(3)))
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(f"datasets:\n  - name: chat\n    source: {data}\n    format: messages\n"
                        f"    regenerate: {str(regenerate).lower()}\n")
    return str(manifest)


def test_refuses_unknown_and_mistyped_config_keys_before_running(tmp_path):
    op = Eagle3StageOperator(task_id="vocab", stage="vocab", root=str(tmp_path),
                             config={"merged": "m", "out": "o", "draft_vocab_size": 64, "vocab_sise": 1})
    with pytest.raises(InputError, match=r"vocab\.config\.vocab_sise"):
        op.execute(context())
    op = Eagle3StageOperator(task_id="vocab", stage="vocab", root=str(tmp_path),
                             config={"merged": "m", "out": "o", "draft_vocab_size": "64"})
    with pytest.raises(InputError, match="draft_vocab_size='64' is not a int"):
        op.execute(context())
    with pytest.raises(KeyError, match="no stage 'vocabulary'"):
        Eagle3StageOperator(task_id="v", stage="vocabulary", root=str(tmp_path), config={})


def test_in_process_result_is_kept_in_the_run_layout_and_pushed(tmp_path):
    op = Eagle3StageOperator(task_id="discover.plan", stage="discover", root=str(tmp_path),
                             config={"manifest": _manifest(tmp_path, regenerate=True), "root": str(tmp_path),
                                     "extract_shards": 2})
    pushed = op.execute(context())
    kept = json.loads((tmp_path / "runs/dag/run1/summaries/discover.plan.json").read_text())
    assert pushed == kept
    assert kept["regenerate"] == [{"datasets": ["chat"]}]
    assert kept["extract"] == [{"shard": "0/2"}, {"shard": "1/2"}]
    assert kept["tokenize"][0]["source_override"] == f"{tmp_path}/regenerated/chat/regenerated.jsonl"


@pytest.mark.parametrize("tasks, groups", [(0, [["a"], ["b"], ["c"]]), (1, [["a", "b", "c"]]),
                                           (2, [["a", "c"], ["b"]]), (5, [["a"], ["b"], ["c"]])])
def test_regenerate_tasks_deal_the_datasets_over_that_many_tasks(tmp_path, tasks, groups):
    from eagle3.discover import DiscoverConfig, discover

    lines = "".join(f"  - {{name: {n}, source: {tmp_path}/{n}.jsonl, format: messages, regenerate: {str(n != 'x').lower()}}}\n"
                    for n in ("a", "x", "b", "c"))
    for n in ("a", "x", "b", "c"):
        (tmp_path / f"{n}.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "m.yaml").write_text("datasets:\n" + lines)
    found = discover(DiscoverConfig(manifest=str(tmp_path / "m.yaml"), root=str(tmp_path), regenerate_tasks=tasks))
    assert [g["datasets"] for g in found["regenerate"]] == groups
    assert [t["dataset"] for t in found["tokenize"]] == ["a", "x", "b", "c"]


@pytest.mark.parametrize("value", [-1, 1025, True, "2"])
def test_regenerate_tasks_out_of_range_is_refused(tmp_path, value):
    from eagle3.discover import DiscoverConfig

    with pytest.raises(InputError, match=rf"DiscoverConfig.regenerate_tasks={value!r} must be an integer in \[0, 1024\]"):
        DiscoverConfig(manifest="m.yaml", root=str(tmp_path), regenerate_tasks=value)


def test_a_large_result_goes_to_xcom_by_path(tmp_path, monkeypatch):
    import operators.stage

    monkeypatch.setattr(operators.stage, "XCOM_LIMIT", 10)
    op = Eagle3StageOperator(task_id="discover", stage="discover", root=str(tmp_path),
                             config={"manifest": _manifest(tmp_path), "root": str(tmp_path)})
    pushed = op.execute(context(map_index=3))
    assert pushed["result_file"] == f"{tmp_path}/runs/dag/run1/summaries/discover.3.json"
    assert json.loads(Path(pushed["result_file"]).read_text())["tokenize"][0]["dataset"] == "chat"


def test_no_connection_is_copied_into_this_process_environment(tmp_path, monkeypatch):
    from operators.hooks import Eagle3StorageHook

    monkeypatch.setenv("AIRFLOW_CONN_EAGLE3_S3", json.dumps({
        "conn_type": "aws", "login": "AKIA", "password": "s3cret", "extra": {"endpoint_url": "http://127.0.0.1:9"}}))
    before = dict(os.environ)
    hook = Eagle3StorageHook()
    assert hook.settings.endpoint_url == "http://127.0.0.1:9" and hook.settings.secret_key == "s3cret"
    assert hook.child_env() == {"EAGLE3_S3_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AKIA",
                                "AWS_SECRET_ACCESS_KEY": "s3cret"}
    assert dict(os.environ) == before
    assert Eagle3StorageHook("no_such_conn").settings is None


def _prompts(tmp_path) -> str:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Say {i}"}) + "\n" for i in range(3)))
    return str(p)


def _evaluate_op(tmp_path, model, **config):
    from tests.evaluate.conftest import export_draft

    if not (tmp_path / "draft" / "config.json").exists():  # evaluate checks the draft before any engine starts
        export_draft(model, tmp_path / "draft")
    return Eagle3StageOperator(task_id="evaluate", stage="evaluate", root=str(tmp_path), config={
        "model": model, "draft": str(tmp_path / "draft"), "out": str(tmp_path / "eval"), "backend": "sglang",
        "prompts": _prompts(tmp_path), "limit": 3, "max_new_tokens": 12, "steps": 4, **config})


def test_sglang_evaluate_runs_both_servers_in_the_child_and_stops_them(fake_sglang, tmp_path, tiny_llama_dir):
    summary = _evaluate_op(tmp_path, tiny_llama_dir).execute(context())
    base, spec = _runs(fake_sglang)
    pairs = dict(zip(spec["argv"][::2], spec["argv"][1::2]))
    assert "--speculative-algorithm" not in base["argv"] and pairs["--speculative-algorithm"] == "EAGLE3"
    assert (pairs["--speculative-num-steps"], pairs["--speculative-num-draft-tokens"]) == ("4", "5")
    assert summary["acceptance_length"] == pytest.approx(12 / 5)  # the fake accepts 2.5 per verification
    assert json.loads((tmp_path / "runs/dag/run1/summaries/evaluate.json").read_text()) == summary
    assert not alive(base["pid"]) and not alive(spec["pid"])


def _execute_in_thread(op) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``op.execute`` in a thread, as the task runner would, so the test can call ``on_kill`` meanwhile."""
    failures: list[BaseException] = []

    def run():
        try:
            op.execute(context())
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            failures.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, failures


def test_on_kill_while_a_server_starts_stops_the_child_and_the_server(fake_sglang, tmp_path, tiny_llama_dir,
                                                                      monkeypatch):
    monkeypatch.setenv("FAKE_SGLANG_STARTUP_S", "120")  # /health stays 503: the stage waits
    op = _evaluate_op(tmp_path, tiny_llama_dir)
    t, failures = _execute_in_thread(op)
    deadline = time.time() + 60
    while not _runs(fake_sglang) and time.time() < deadline:
        time.sleep(0.2)
    (started,) = _runs(fake_sglang)
    assert alive(started["pid"])
    op.on_kill()  # what Airflow calls when the task is stopped from the UI
    t.join(timeout=60)
    assert not t.is_alive() and failures, "execute must end with an error after on_kill"
    assert not alive(started["pid"])
    assert len(_runs(fake_sglang)) == 1  # no EAGLE3 phase after the kill
    assert not (tmp_path / "eval" / "sglang_report.json").exists()


def test_regenerate_serves_uses_and_stops_its_own_sglang_server(fake_sglang, tmp_path, tiny_llama_dir):
    op = RegenerateOperator(task_id="regenerate", root=str(tmp_path), config={
        "manifest": _manifest(tmp_path, regenerate=True), "out": str(tmp_path / "regenerated"),
        "model": tiny_llama_dir, "server": "sglang", "concurrency": 2})
    result = op.execute(context(map_index=0))
    (server,) = _runs(fake_sglang)
    assert server["argv"][:2] == ["--model-path", tiny_llama_dir]
    assert not alive(server["pid"])
    out = [json.loads(x) for x in (tmp_path / "regenerated/chat/regenerated.jsonl").read_text().splitlines()]
    assert sorted(r["messages"][-1]["content"] for r in out) == [f"fake answer to: question {i}" for i in range(3)]
    stats = result["datasets"]["chat"]
    assert (stats["conversations"], stats["done"], stats["failed"], stats["complete"]) == (3, 3, 0, True)


def test_on_kill_while_vllm_starts_stops_the_child_and_the_server(monkeypatch, tmp_path, tiny_llama_dir):
    """The vLLM evaluate path through the operator: the server runs in the stage's child (a grandchild of the
    task) in its own process group; on_kill SIGTERMs the child, whose exit stops the server."""
    record = tmp_path / "starts.jsonl"
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_DIR / 'fake_vllm'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("EAGLE3_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    monkeypatch.setenv("FAKE_VLLM_STARTUP_S", "120")
    op = _evaluate_op(tmp_path, tiny_llama_dir, backend="vllm")
    t, failures = _execute_in_thread(op)
    deadline = time.time() + 90
    # the fake creates the file, then writes its line: wait for the whole line (under load the two are apart)
    while not (record.exists() and record.read_text().endswith("\n")) and time.time() < deadline:
        time.sleep(0.2)
    (started,) = [json.loads(x) for x in record.read_text().splitlines()]
    assert alive(started["pid"])
    op.on_kill()
    t.join(timeout=60)
    assert not t.is_alive() and failures
    deadline = time.time() + 10
    while alive(started["pid"]) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(started["pid"]), "the vLLM server outlived the killed task"
    assert len(record.read_text().splitlines()) == 1  # no speculative phase after the kill


def test_train_operator_sets_the_deadline_from_the_runs_start(tmp_path, monkeypatch):
    from datetime import datetime, timezone

    from operators.stage import TrainOperator

    seen = []
    monkeypatch.setattr(Eagle3StageOperator, "execute", lambda self, ctx: seen.append(dict(self.build_config())))
    monkeypatch.setattr(Eagle3StageOperator, "build_config", lambda self: self.config)
    start = datetime(2026, 12, 3, 15, 0, tzinfo=timezone.utc)
    ctx = {**context(), "dag_run": SimpleNamespace(start_date=start)}
    op = TrainOperator(task_id="train", root=str(tmp_path), config={"train_time_budget": 150},
                       run_time_budget="840", after_train_reserve=270)  # templated: may render as strings
    op.execute(ctx)
    assert seen[-1] == {"train_time_budget": 150, "train_deadline": start.timestamp() + 840 - 270}
    TrainOperator(task_id="train", root=str(tmp_path), config={"train_time_budget": 150},
                  run_time_budget=0, after_train_reserve=270).execute(ctx)
    assert "train_deadline" not in seen[-1]  # no run budget: train_time_budget alone
    TrainOperator(task_id="train", root=str(tmp_path), config={"train_time_budget": 150},
                  run_time_budget=840, after_train_reserve=270).execute(context())
    assert "train_deadline" not in seen[-1]  # no dag run start known: no deadline
    with pytest.raises(InputError, match="run_time_budget=300 s leaves nothing for training after "
                                         "after_train_reserve=300 s"):
        TrainOperator(task_id="train", root=str(tmp_path), config={}, run_time_budget=300,
                      after_train_reserve=300).execute(ctx)


def test_train_operator_scales_the_reserve_by_this_runs_extraction_rate(tmp_path, monkeypatch):
    """The extract shards' kept results (the run's summaries) give the rate: 2 shards at 1,000 and 1,500 tok/s
    of 3,000 tokens each -> 1,200 tok/s; a 270-s reserve sized at 750 keeps 270 * 750 / 1200 = 168.75 s."""
    from datetime import datetime, timezone

    from eagle3 import storage
    from eagle3.layout import RunLayout
    from operators.stage import TrainOperator

    seen = []
    monkeypatch.setattr(Eagle3StageOperator, "execute", lambda self, ctx: seen.append(dict(self.build_config())))
    monkeypatch.setattr(Eagle3StageOperator, "build_config", lambda self: self.config)
    start = datetime(2026, 12, 4, 15, 0, tzinfo=timezone.utc)
    ctx = {**context(), "dag_run": SimpleNamespace(start_date=start)}
    layout = RunLayout(str(tmp_path), "dag", "run1")

    def train(sized_at="750"):
        TrainOperator(task_id="train", root=str(tmp_path), config={}, run_time_budget="780",
                      after_train_reserve="270", reserve_tokens_per_s=sized_at).execute(ctx)
        return seen[-1]["train_deadline"] - start.timestamp()

    assert train() == 780 - 270  # no extract results yet (online, or none kept): the reserve as given
    storage.write_json(layout.task_result("extract", 0), {"tokens": 3000, "tokens_per_s": 1000.0})
    storage.write_json(layout.task_result("extract", 1), {"tokens": 3000, "tokens_per_s": 1500.0})
    storage.write_json(layout.task_result("extract_other", 0), {"tokens": 3000, "tokens_per_s": 10.0})  # not ours
    assert train() == pytest.approx(780 - 168.75)
    assert train(sized_at="0") == 780 - 270  # not sized: not scaled
    storage.write_json(layout.task_result("extract", 1), {"tokens": 0, "tokens_per_s": None})  # reused its shard
    assert train() == pytest.approx(780 - 202.5)  # 1,000 tok/s from shard 0 alone
    Path(layout.task_result("extract", 0)).write_text("{not json")
    assert train() == 780 - 270  # an unreadable result is logged and costs only the scaling


def test_train_operator_reads_the_extraction_rate_from_an_s3_root(s3_bucket, monkeypatch):
    """The same scaling with the run's summaries on S3 (a moto endpoint): read when the config is built, after
    the task has configured storage."""
    from datetime import datetime, timezone

    from eagle3 import storage
    from eagle3.layout import RunLayout
    from operators.stage import TrainOperator

    seen = []
    monkeypatch.setattr(Eagle3StageOperator, "execute", lambda self, ctx: seen.append(dict(self.build_config())))
    monkeypatch.setattr(Eagle3StageOperator, "build_config", lambda self: self.config)
    start = datetime(2026, 12, 4, 15, 0, tzinfo=timezone.utc)
    root = f"{s3_bucket}/eagle3"
    shard = RunLayout(root, "dag", "run1").task_result("extract", 0)
    storage.write_json(shard, {"tokens": 6000, "tokens_per_s": 1500.0})
    TrainOperator(task_id="train", root=root, config={}, run_time_budget=780, after_train_reserve=270,
                  reserve_tokens_per_s=750).execute({**context(), "dag_run": SimpleNamespace(start_date=start)})
    assert seen[-1]["train_deadline"] - start.timestamp() == pytest.approx(780 - 135)  # 750 / 1500: half kept
