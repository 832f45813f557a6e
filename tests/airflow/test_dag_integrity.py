"""The eagle3_train DAG parses fast, without heavy imports, and is wired as designed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "pandas", "pyarrow", "safetensors", "numpy")


@pytest.fixture(scope="module")
def dag():
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    sys.path.insert(0, str(REPO))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags["eagle3_train"]


def test_parse_imports_nothing_heavy():
    code = (
        "import sys, importlib.util\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        f"spec = importlib.util.spec_from_file_location('d', {str(REPO / 'dags/eagle3_train.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"print([k for k in sys.modules if k.split('.')[0] in {HEAVY!r}])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_stage_order_pools_and_queues(dag):
    order = ["tokenize", "stats", "merge", "verify", "vocab", "extract", "train", "export", "evaluate",
             "publish", "report"]
    for up, down in zip(order, order[1:]):
        assert down in dag.task_dict[up].downstream_task_ids, (up, down)
    for tid in ("extract", "train", "evaluate"):
        assert dag.task_dict[tid].pool == "gpu" and dag.task_dict[tid].queue == "gpu", tid
    for tid in ("tokenize", "merge", "verify", "vocab"):
        assert dag.task_dict[tid].queue == "default" and dag.task_dict[tid].pool == "default_pool", tid
    assert dag.task_dict["tokenize"].map_index_template == "{{ task.mapped.dataset }}"
    assert dag.task_dict["extract"].map_index_template == "{{ task.mapped.shard }}"
    assert [o.uri for o in dag.task_dict["publish"].outlets] == ["eagle3://draft_model/"]


def test_retry_policy_oom_retries_bad_input_fails(dag):
    from airflow.sdk import RetryAction

    from eagle3.errors import GateFailed, GpuOutOfMemory, InputError

    for tid in ("extract", "train", "tokenize"):
        policy = dag.task_dict[tid].retry_policy
        assert policy.evaluate(GpuOutOfMemory("oom"), 1, 3).action == RetryAction.RETRY
        assert policy.evaluate(InputError("bad", file="x.jsonl", line=3), 1, 3).action == RetryAction.FAIL
        assert policy.evaluate(GateFailed("gate"), 1, 3).action == RetryAction.FAIL
        assert policy.evaluate(RuntimeError("flaky"), 1, 3).action == RetryAction.DEFAULT


def test_retry_policy_module_imports_no_torch():
    code = "import sys; import operators.retry, eagle3.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "False"


def test_params_have_titles_and_refuse_bad_values(dag):
    from airflow.sdk.definitions.param import ParamsDict

    for name, param in dag.params.items():
        p = dag.params.get_param(name)
        assert p.schema.get("title") and p.description, name
    bad = {"max_seq_len": 3, "draft_vocab_size": "big", "storage_option": "fp4", "steps": 0}
    for key, value in bad.items():
        params = ParamsDict(dag.params)
        with pytest.raises(Exception) as err:
            params[key] = value
            params.validate()
        assert key in str(err.value) or "valid" in str(err.value).lower(), (key, str(err.value))


def test_pools_file_defines_gpu_pool():
    pools = json.loads((REPO / "pools.json").read_text())
    assert pools["gpu"]["slots"] >= 1


def test_schedule_has_one_asset_per_dataset_of_the_manifest(tmp_path):
    from tests.airflow.tiny_data import write_tiny_manifest

    manifest = write_tiny_manifest(tmp_path)
    code = (
        "import sys; from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO / 'dags')!r})\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "t = bag.dags['eagle3_train'].timetable\n"
        "print(type(t).__name__, sorted(a.uri for a in t.asset_condition.objects) if hasattr(t.asset_condition, 'objects') else t.asset_condition)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "EAGLE3_MANIFEST": str(manifest), "PYTHONPATH": str(REPO),
                              "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    assert out.returncode == 0, out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("AssetOrTimeSchedule"), line
    assert f"file://{tmp_path}/alpha.jsonl" in line and f"file://{tmp_path}/beta.jsonl" in line, line


def test_every_task_is_the_eagle3_stage_of_its_name(dag):
    """One DAG task = eagle3/<task> exposing <task>(cfg): the stage operators by their `stage`, the task
    group `discover` by its group name (its selectors only split the plan into the lists tasks map over)."""
    import importlib

    from eagle3.stages import STAGES

    for task_id, task in dag.task_dict.items():
        name = task_id.split(".")[0]
        assert name in STAGES, task_id
        module = importlib.import_module(f"eagle3.{name}")
        assert callable(getattr(module, name)) and hasattr(module, STAGES[name].config), task_id
        if hasattr(task, "stage"):
            assert task.stage == name or task_id.startswith(task.stage + "."), (task_id, task.stage)
    assert set(STAGES) == {t.split(".")[0] for t in dag.task_dict}


def test_params_take_their_defaults_from_the_stage_configs(dag):
    from eagle3.config import default
    from eagle3.extract import ExtractConfig
    from eagle3.merge import MergeConfig
    from eagle3.train import TrainConfig
    from eagle3.vocab import VocabConfig

    for param, (cls, field) in {"lr": (TrainConfig, "lr"), "train_token_budget": (TrainConfig, "token_budget"),
                                "extract_token_budget": (ExtractConfig, "token_budget"),
                                "max_seq_len": (MergeConfig, "max_seq_len"), "epochs": (TrainConfig, "epochs"),
                                "draft_vocab_size": (VocabConfig, "draft_vocab_size")}.items():
        assert dag.params[param] == default(cls, field), param
    assert dag.params["seed"] == default(TrainConfig, "seed") == default(MergeConfig, "seed")


def test_one_precision_param_reaches_every_stage_that_computes(dag):
    """regenerate (hf), extract, train and evaluate (transformers) share one Param; its default and choices
    are the stage Configs' (eagle3.devices owns them)."""
    from eagle3.config import default
    from eagle3.devices import PRECISIONS
    from eagle3.evaluate import EvaluateConfig
    from eagle3.extract import ExtractConfig
    from eagle3.regenerate import RegenerateConfig
    from eagle3.train import TrainConfig

    configs = (ExtractConfig, TrainConfig, EvaluateConfig, RegenerateConfig)
    assert {default(cls, "precision") for cls in configs} == {dag.params["precision"]} == {"auto"}
    assert dag.params.get_param("precision").schema["enum"] == list(PRECISIONS)
    ctx = {"params": {**{k: dag.params[k] for k in dag.params}, "precision": "bfloat16", "storage_root": "/r"},
           "run_id": "r1", "ti": _TI("offline")}
    for task_id in ("extract", "train", "evaluate", "regenerate"):
        task = dag.get_task(task_id)
        cfg = task.render_template(task.partial_kwargs["config"] if hasattr(task, "partial_kwargs") else task.config,
                                   ctx, jinja_env=dag.get_template_env())
        assert cfg["precision"] == "bfloat16", task_id


def test_params_reach_the_config_with_their_type(dag):
    """render_template_as_native_obj: an int Param renders as an int, a list as a list, None as None."""
    params = {**{k: dag.params[k] for k in dag.params}, "extract_tokens_per_s": 750, "seed": 7,
              "drop": ["long_reports"], "aux_layers": None, "storage_root": "/r", "model": "m"}
    ctx = {"params": params, "run_id": "r1"}
    verify = dag.get_task("verify")
    cfg = verify.render_template(verify.config, ctx, jinja_env=dag.get_template_env())
    assert cfg["tokens_per_s"] == 750 and isinstance(cfg["tokens_per_s"], int)
    # the gate is told what merge was asked for (a stale merge of another run fails it)
    from eagle3.config import from_dict as _from_dict
    from eagle3.verify import VerifyConfig

    vcfg = _from_dict(VerifyConfig, cfg)
    assert (vcfg.expect_seed, vcfg.expect_drop, vcfg.expect_manifest) == (7, ("long_reports",), params["manifest"])
    assert vcfg.expect_max_seq_len == params["max_seq_len"]
    merge = dag.get_task("merge")
    cfg = merge.render_template(merge.config, ctx, jinja_env=dag.get_template_env())
    assert cfg["seed"] == 7 and cfg["drop"] == ["long_reports"] and cfg["out"] == "/r/runs/eagle3_train/r1/merged"
    from eagle3.config import from_dict
    from eagle3.merge import MergeConfig

    assert from_dict(MergeConfig, cfg).drop == ("long_reports",)


class _TI:
    """The one TaskInstance call the train template makes: the training mode verify chose."""

    def __init__(self, mode: str):
        self.mode = mode

    def xcom_pull(self, task_ids: str):
        assert task_ids == "discover.training_mode"
        return self.mode


def test_training_mode_param_reaches_verify_and_online_skips_extract(dag):
    """verify decides offline/online (eagle3.verify.mode); online maps extract over no shard (skipped), train
    still runs (none_failed) with online=True and holds the target's GPU slots."""
    from eagle3.config import default
    from eagle3.verify import VerifyConfig
    from eagle3.verify.mode import MODES

    assert dag.params["training_mode"] == default(VerifyConfig, "training_mode") == "offline"
    assert dag.params.get_param("training_mode").schema["enum"] == list(MODES)
    ctx = {"params": {**{k: dag.params[k] for k in dag.params}, "training_mode": "auto", "epochs": 3,
                      "storage_root": "/r"}, "run_id": "r1"}
    verify = dag.get_task("verify")
    cfg = verify.render_template(verify.config, ctx, jinja_env=dag.get_template_env())
    assert cfg["training_mode"] == "auto" and cfg["epochs"] == 3
    train = dag.get_task("train")
    for mode, online in (("online", True), ("offline", False)):
        cfg = train.render_template(train.config, {**ctx, "ti": _TI(mode)}, jinja_env=dag.get_template_env())
        assert cfg["online"] is online and cfg["write_back"] is False
        back = {**ctx, "params": {**ctx["params"], "online_write_back": True}, "ti": _TI(mode)}
        cfg = train.render_template(train.config, back, jinja_env=dag.get_template_env())
        assert cfg["write_back"] is online  # write-back only where training runs online
    assert train.trigger_rule == "none_failed" and train.pool_slots >= 1
    shards = dag.get_task("discover.extract_shards")
    assert "discover.training_mode" in shards.upstream_task_ids and "extract" in shards.downstream_task_ids
    assert "verify" in dag.get_task("discover.training_mode").upstream_task_ids
    pick = shards.python_callable
    assert pick([{"shard": "0/2"}, {"shard": "1/2"}], "online") == []
    assert pick([{"shard": "0/1"}], "offline") == [{"shard": "0/1"}]
