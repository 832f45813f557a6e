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
             "publish", "report", "outcome"]
    for up, down in zip(order, order[1:]):
        assert down in dag.task_dict[up].downstream_task_ids, (up, down)
    for tid in ("regenerate", "extract", "train", "evaluate"):  # what runs the target or the draft
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
        assert p.schema.get("title") and p.schema.get("description_md"), name
    bad = {"max_seq_len": 3, "draft_vocab_size": "big", "storage_option": "fp4", "steps": 0, "epochs": 1.5,
           "lr": -1, "aux_layers": "1,2"}
    for key, value in bad.items():
        params = ParamsDict(dag.params)
        with pytest.raises(Exception) as err:
            params[key] = value
            params.validate()
        assert key in str(err.value), (key, str(err.value))


def test_the_trigger_form_shows_what_the_server_checks(dag):
    """Airflow's form clamps a number to schema minimum/maximum silently and shows ``description`` as plain text:
    no Param has top-level bounds (they are in allOf, which the server checks), each says its bounds in its
    Markdown help, no help shows RST literals, and a null choice has a label."""
    for name in dag.params:
        schema = dag.params.get_param(name).schema
        assert not {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & set(schema), (name, schema)
        md = schema["description_md"]
        assert "``" not in md, (name, md)
        if schema.get("allOf"):
            assert "at least" in md or "more than" in md or "at most" in md, (name, md)
        if None in (schema.get("enum") or []):
            assert "null" in schema.get("values_display", {}), name
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if "array" in types and (schema.get("items") or {}).get("enum"):
            assert schema.get("examples") == schema["items"]["enum"], name  # a multi-select, not a text box
        if "array" in types:  # emptied in the form, a list is null: not "required", and read as []
            assert "null" in types, name
    assert dag.params.get_param("max_seq_len").schema["allOf"] == [{"minimum": 16, "maximum": 1048576}]
    assert "An integer, at least 16" in dag.params.get_param("max_seq_len").schema["description_md"]


def test_the_dag_doc_diagram_is_a_code_block(dag):
    assert "```\ndiscover ─►" in dag.doc_md and dag.doc_md.count("```") == 2


def test_task_groups_have_no_cycle(dag):
    """A group on both sides of a task is a cycle between groups: the UI's Graph and Grid fail with HTTP 500
    (`topological_sort` is what they call)."""
    groups = [dag.task_group]
    while groups:
        group = groups.pop()
        group.topological_sort()  # raises on a cycle
        groups += [c for c in group.children.values() if hasattr(c, "children")]
    discover = dag.task_group.children["discover"]
    inside = set(discover.children)
    assert not any(dag.task_dict[t].upstream_task_ids - inside for t in inside if t != "discover.plan")


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
        if task_id == "outcome":  # the one task that is no stage: it fails the run when a task failed
            continue
        name = task_id.split(".")[0]
        assert name in STAGES, task_id
        module = importlib.import_module(f"eagle3.{name}")
        assert callable(getattr(module, name)) and hasattr(module, STAGES[name].config), task_id
        if hasattr(task, "stage"):
            assert task.stage == name or task_id.startswith(task.stage + "."), (task_id, task.stage)
    assert set(STAGES) | {"outcome"} == {t.split(".")[0] for t in dag.task_dict}


def test_params_default_to_the_demo_settings_else_the_stage_configs(dag):
    """One owner per default: eagle3.demo.settings for what the demo sets (so the form's defaults are the demo's
    run), the stage Config for the rest."""
    from eagle3.config import default
    from eagle3.demo import settings
    from eagle3.merge import MergeConfig
    from eagle3.train import TrainConfig
    from eagle3.verify import VerifyConfig

    for name, value in settings.PARAMS.items():
        assert dag.params[name] == value, name
    for param, (cls, field) in {"seed": (TrainConfig, "seed"), "training_mode": (VerifyConfig, "training_mode"),
                                "max_steps": (TrainConfig, "max_steps")}.items():
        assert param not in settings.PARAMS and dag.params[param] == default(cls, field), param
    assert dag.params["seed"] == default(TrainConfig, "seed") == default(MergeConfig, "seed")
    assert dag.params["manifest"].endswith("/demo/manifest.yaml") and dag.params["regenerate_restart"] is False


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
    extract = dag.get_task("extract")
    for text, aux_layers in ((None, None), (" 1, 14,26 ", [1, 14, 26])):
        cfg = extract.render_template(extract.partial_kwargs["config"], {**{"params": params, "run_id": "r1"},
                                      "params": {**params, "aux_layers": text}}, jinja_env=dag.get_template_env())
        assert cfg["aux_layers"] == aux_layers
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
    emptied = merge.render_template(merge.config, {**ctx, "params": {**params, "drop": None}},
                                    jinja_env=dag.get_template_env())
    assert emptied["drop"] == []  # a list emptied in the form arrives as null
    from eagle3.config import from_dict
    from eagle3.merge import MergeConfig

    assert from_dict(MergeConfig, cfg).drop == ("long_reports",)


class _TI:
    """The TaskInstance calls the train template makes: the training mode and the token budget verify chose."""

    def __init__(self, mode: str, budget: int | None = None):
        self.mode, self.budget = mode, budget

    def xcom_pull(self, task_ids: str, key: str):
        assert task_ids == "verify" and key in ("training_mode", "train_token_budget")
        return self.mode if key == "training_mode" else self.budget


def test_train_takes_the_budget_verify_sized(dag):
    """verify's memory check picks the micro-batch that fits (eagle3.verify.sizing); train renders it, and
    the Param where verify pushed none."""
    train = dag.get_task("train")
    params = {k: v.value if hasattr(v, "value") else v for k, v in dag.params.items()}
    for pushed, want in ((3008, 3008), (None, params["train_token_budget"])):
        ctx = {"params": params, "run_id": "r1", "ti": _TI("offline", pushed)}
        cfg = train.render_template(train.config, ctx, jinja_env=dag.get_template_env())
        assert cfg["token_budget"] == want
    verify = dag.get_task("verify")
    cfg = verify.render_template(verify.config, {"params": params, "run_id": "r1"}, jinja_env=dag.get_template_env())
    from eagle3.config import from_dict
    from eagle3.verify import VerifyConfig

    v = from_dict(VerifyConfig, cfg)
    assert (v.train_token_budget, v.ttt_length, v.target_engine) == (
        params["train_token_budget"], params["ttt_length"], params["target_engine"])


def test_training_mode_param_reaches_verify_and_online_skips_extract(dag):
    """verify decides offline/online (eagle3.verify.mode) and pushes it; online skips every extract shard,
    train still runs (none_failed) with online=True and holds the target's GPU slots."""
    from airflow.sdk.exceptions import AirflowSkipException

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
    pushed = {}
    ti = type("TI", (), {"xcom_push": lambda self, key, value: pushed.update({key: value})})()
    result = {"training_mode": {"mode": "online"}, "train_token_budget": 4096}
    assert verify.after(result, {"ti": ti}) == result
    assert pushed == {"training_mode": "online", "train_token_budget": 4096}
    train = dag.get_task("train")
    extract = dag.get_task("extract")
    for mode, online in (("online", True), ("offline", False)):
        cfg = train.render_template(train.config, {**ctx, "ti": _TI(mode)}, jinja_env=dag.get_template_env())
        assert cfg["online"] is online and cfg["write_back"] is False
        back = {**ctx, "params": {**ctx["params"], "online_write_back": True}, "ti": _TI(mode)}
        cfg = train.render_template(train.config, back, jinja_env=dag.get_template_env())
        assert cfg["write_back"] is online  # write-back only where training runs online
        assert extract.render_template(extract.partial_kwargs["online"], {**ctx, "ti": _TI(mode)},
                                       jinja_env=dag.get_template_env()) is online
    assert train.trigger_rule == "none_failed" and train.pool_slots >= 1
    assert "verify" in extract.upstream_task_ids or "vocab" in extract.upstream_task_ids
    from operators.stage import ExtractOperator

    shard = ExtractOperator(task_id="x", root="/r", config={}, online=True)
    with pytest.raises(AirflowSkipException, match="online"):
        shard.execute({})


def test_report_runs_on_every_outcome_and_outcome_is_the_only_leaf(dag):
    assert dag.get_task("report").trigger_rule == "all_done"
    outcome = dag.get_task("outcome")
    assert outcome.trigger_rule == "all_done" and outcome.upstream_task_ids == {"report"}
    assert [t.task_id for t in dag.tasks if not t.downstream_task_ids] == ["outcome"]
    assert outcome.retries == 0


def test_target_engine_param_offers_sglang_and_each_stage_gets_it(dag):
    """``target_engine=sglang`` (with the storage it fills) passes the form and reaches extract, verify and online
    train as configs they accept; with a storage SGLang cannot fill, the form passes and verify's config (the
    gate, before any GPU work) refuses it naming both Params."""
    from airflow.sdk.definitions.param import ParamsDict

    from eagle3.config import from_dict
    from eagle3.errors import InputError
    from eagle3.extract import ExtractConfig
    from eagle3.extract.config import ENGINES
    from eagle3.train import TrainConfig
    from eagle3.verify import VerifyConfig

    schema = dag.params.get_param("target_engine").schema
    assert schema["enum"] == list(ENGINES) and "sglang" in schema["enum"]
    assert set(schema["values_display"]) == set(ENGINES) and "SGLang" in schema["values_display"]["sglang"]
    params = ParamsDict(dag.params)
    params["target_engine"], params["storage_option"] = "sglang", "fp8-topk"
    params.validate()
    values = {**{k: dag.params[k] for k in dag.params}, "target_engine": "sglang", "storage_option": "fp8-topk",
              "target_tensor_parallel_size": 8, "storage_root": "/r", "model": "m"}
    ctx = {"params": values, "run_id": "r1", "ti": _TI("online")}
    extract, verify, train = (dag.get_task(t) for t in ("extract", "verify", "train"))
    env = dag.get_template_env()
    e = from_dict(ExtractConfig, extract.render_template(extract.partial_kwargs["config"], ctx, jinja_env=env))
    assert (e.engine, e.tensor_parallel_size, e.storage_option, e.gpus()) == ("sglang", 8, "fp8-topk", 8)
    v = from_dict(VerifyConfig, verify.render_template(verify.config, ctx, jinja_env=env))
    assert (v.target_engine, v.tensor_parallel_size) == ("sglang", 8)
    t = from_dict(TrainConfig, train.render_template(train.config, ctx, jinja_env=env))
    assert (t.online, t.target_engine, t.target_tensor_parallel_size) == (True, "sglang", 8)
    bad = {**ctx, "params": {**values, "storage_option": "bf16"}}
    with pytest.raises(InputError,
                       match="storage_option='bf16' cannot be filled by VerifyConfig.target_engine='sglang'"):
        from_dict(VerifyConfig, verify.render_template(verify.config, bad, jinja_env=env))


def test_discover_checks_what_later_stages_would_refuse_before_any_work(dag, tmp_path):
    """The plan task renders the run's drop list, train and evaluate settings and aux layers into discover's
    preflight: the demo's defaults pass it, and a value merge, train, evaluate or extract would refuse only hours
    later fails the run's first task."""
    from eagle3.config import from_dict
    from eagle3.discover import DiscoverConfig, discover
    from eagle3.errors import InputError

    for n in ("a", "long_reports"):
        (tmp_path / f"{n}.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "m.yaml").write_text("datasets:\n" + "".join(
        f"  - {{name: {n}, source: {tmp_path}/{n}.jsonl, format: messages}}\n" for n in ("a", "long_reports")))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "model_type": "llama"}))
    params = {**{k: dag.params[k] for k in dag.params}, "manifest": str(tmp_path / "m.yaml"),
              "storage_root": str(tmp_path), "model": str(tmp_path / "model")}
    plan = dag.get_task("discover.plan")

    def run(**changed):
        cfg = plan.render_template(plan.config, {"params": {**params, **changed}, "run_id": "r1"},
                                   jinja_env=dag.get_template_env())
        return discover(from_dict(DiscoverConfig, cfg))

    assert [t["dataset"] for t in run()["tokenize"]] == ["a", "long_reports"]  # the demo's settings pass
    for changed, message in (
            ({"drop": ["long_report"]}, r"drop names dataset\(s\) \['long_report'\] that the manifest does not have"),
            ({"evaluate_backend": "vllm"}, "compare_with"),  # vLLM compared with itself
            ({"benchmark_prompts": "humaneval,nosuch"}, "nosuch"),
            ({"parallel_drafting": True, "ttt_length": 1}, "parallel_drafting"),
            ({"aux_layers": "1,4,9"}, r"aux layers \[1, 4, 9\]: need 3 layer ids in \[0, 6\]")):
        with pytest.raises(InputError, match=message):
            run(**changed)


def test_the_run_confs_the_docs_show_are_valid_params(dag):
    """Each JSON run conf in README.md and docs/*.md (a code block of an object whose keys are all Params) is one
    the trigger form would accept: every key a Param, every value valid."""
    import copy
    import re

    from tests.doc_scan import DOCS

    checked = 0
    for doc in DOCS:
        for block in re.findall(r"```json\n(.*?)```", doc.read_text(), re.S):
            conf = json.loads(block)
            if not isinstance(conf, dict) or not set(conf) & {"model", "storage_root"}:
                continue
            unknown = sorted(set(conf) - set(dag.params))
            assert not unknown, f"{doc.name}: not Params: {unknown}"
            params = copy.deepcopy(dag.params)
            for key, value in conf.items():
                params[key] = value
            params.validate()
            checked += 1
    assert checked >= 1


def test_the_plan_lists_read_a_result_too_large_for_xcom_from_its_file(dag, tmp_path):
    """Eagle3StageOperator puts a result over its XCom limit in a file (~740 extract shards, or ~110 regenerated
    datasets on s3): the three lists the mapped tasks expand over read it from there."""
    from eagle3 import storage

    found = {"regenerate": [{"datasets": ["a"]}], "tokenize": [{"dataset": "a", "source_override": None}],
             "extract": [{"shard": f"{i}/900"} for i in range(900)]}
    storage.write_json(str(tmp_path / "plan.json"), found)
    spilled = {"result_file": str(tmp_path / "plan.json"), "bytes": 30000}
    for name in ("regenerate", "tokenize", "extract"):
        callable_ = dag.get_task(f"discover.{name}").python_callable
        assert callable_(spilled) == found[name] == callable_(found)


def test_stats_counts_the_runs_manifest_only(dag):
    """The prepared folder is shared between runs: stats gets the run's manifest, as merge does."""
    from eagle3.config import from_dict
    from eagle3.stats import StatsConfig

    params = {**{k: dag.params[k] for k in dag.params}, "manifest": "/data/mine.yaml", "storage_root": "/r"}
    stats = dag.get_task("stats")
    cfg = stats.render_template(stats.config, {"params": params, "run_id": "r1"}, jinja_env=dag.get_template_env())
    assert from_dict(StatsConfig, cfg).manifest == "/data/mine.yaml"


def _verify_config_parsed_with(env: dict) -> dict:
    """The verify task's device settings and the device_memory_gib Param's default, from a parse under ``env``
    (both are read at parse time)."""
    code = (
        "import json; from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO / 'dags')!r})\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "d = bag.dags['eagle3_train']; c = d.get_task('verify').config\n"
        "print(json.dumps({'elsewhere': c['devices_elsewhere'], 'gib': d.params['device_memory_gib']}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_under_celery_the_gate_is_told_the_gpus_are_elsewhere_and_their_memory(dag):
    """verify runs on the CPU worker (docs/cluster.md): under an executor that routes queue gpu to other workers
    the gate must not size its own RAM; EAGLE3_GPU_MEMORY_GIB gives it one GPU's memory. `airflow dags test` and
    the Local executor (make demo, make airflow) run everything on one machine: nothing changes there."""
    from eagle3.memory import GPU_MEMORY_ENV

    assert dag.get_task("verify").config["devices_elsewhere"] is False and dag.params["device_memory_gib"] == 0
    celery = "airflow.providers.celery.executors.celery_executor.CeleryExecutor"
    assert _verify_config_parsed_with({"AIRFLOW__CORE__EXECUTOR": celery, GPU_MEMORY_ENV: "80"}) == \
        {"elsewhere": True, "gib": 80.0}
    assert _verify_config_parsed_with({"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}) == {"elsewhere": False, "gib": 0}
