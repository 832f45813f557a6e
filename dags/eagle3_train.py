"""eagle3_train: raw conversation datasets → trained, exported, benchmarked EAGLE-3 draft.

```
discover ─► regenerate[ds] ─► tokenize[ds] ─► stats ─► merge ─► verify ─► vocab ─► extract[shard] ─► train
         ─► export ─► evaluate ─► publish ─► report ─► outcome
```

Wiring only: every task is the stage of the same name in the eagle3 core library
(`eagle3.<task>`, exposing `<task>(cfg)`), run by one operator shape. The Params' defaults are
the demo's settings (`eagle3/demo/settings.py`: the bundled SmolLM2 on the demo corpus, about
15 minutes on 2 CPU cores), else the stage Configs' defaults; their help comes from the Configs'
docstrings. Templates render as native objects, so a value keeps its type from the trigger form to
the Config. Where artifacts go is `eagle3.layout`: a run's own folders under
`{storage_root}/runs/eagle3_train/{run_id}/`, the tokenized datasets and the hidden-state store
shared between runs, so a re-run redoes only what changed.

`report` runs whatever happened upstream; `outcome`, the last task, fails when any task of the run
failed, so a run whose gate failed is a failed run (in the UI, and for `airflow dags test`).
Nothing heavy is imported here (parsing stays well under 0.3 s).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, TaskGroup, dag, task
from airflow.sdk.configuration import conf

from eagle3 import layout, storage_options
from eagle3.demo import settings as demo
from eagle3.devices import PRECISION_SUMMARY, PRECISIONS
from eagle3.config import DEFAULT_SEED
from eagle3.discover import DiscoverConfig
from eagle3.draft.config import DRAFT_VARIANTS
from eagle3.evaluate.config import BACKENDS as EVALUATE_BACKENDS
from eagle3.evaluate.config import COMPARABLE as EVALUATE_COMPARABLE
from eagle3.evaluate.config import EvaluateConfig
from eagle3.extract.config import ENGINES as EXTRACT_ENGINES
from eagle3.extract.config import ExtractConfig
from eagle3.memory import GPU_MEMORY_ENV
from eagle3.merge.config import MergeConfig
from eagle3.regenerate.config import BACKENDS as REGENERATE_BACKENDS
from eagle3.regenerate.config import SERVERS as REGENERATE_SERVERS
from eagle3.regenerate.config import RegenerateConfig
from eagle3.report.summary import VERDICT_TASK
from eagle3.stats import StatsConfig
from eagle3.target import SMOLLM2_ALIAS
from eagle3.tokenize.config import TokenizeConfig
from eagle3.train.config import TrainConfig
from eagle3.verify.config import VerifyConfig
from eagle3.verify.mode import MODES as TRAINING_MODES
from eagle3.vocab.config import VocabConfig
from operators.outcome import OutcomeOperator
from operators.params import config_param, form_params
from operators.retry import EAGLE3_RETRY_POLICY
from operators.stage import (Eagle3StageOperator, ExtractOperator, PublishOperator, RegenerateOperator,
                             ReportOperator, TrainOperator, VerifyOperator)

DAG_ID = "eagle3_train"
# The manifest whose dataset sources are the DAG's Assets (read at parse time; YAML only): the demo corpus
# that `make airflow` and `make demo` write under the default storage root.
DEFAULT_MANIFEST = os.environ.get(demo.MANIFEST_ENV, demo.manifest_path(layout.default_root()))
TRAIN_GPUS = int(os.environ.get("EAGLE3_TRAIN_GPUS", "1"))  # pool_slots of train; ≤ pool size
# GPUs the target's forward needs: online training runs it inside the train task, so train holds that many too
TARGET_GPUS = int(os.environ.get("EAGLE3_TARGET_GPUS", "1"))
# Online training from a server (target_engine=vllm or sglang): its own GPUs, held by train on top of the
# trainer's (pool slots are fixed at parse time, so a deployment that trains online from a server sets this).
TARGET_SERVER_GPUS = int(os.environ.get("EAGLE3_TARGET_SERVER_GPUS", "0"))
TRAIN_SLOTS = TRAIN_GPUS + TARGET_SERVER_GPUS if TARGET_SERVER_GPUS else max(TRAIN_GPUS, TARGET_GPUS)
# One GPU-worker device's GiB, the device_memory_gib Param's default: verify runs on the CPU worker, which cannot
# measure the GPUs (0: the gate measures where it runs).
GPU_MEMORY_GIB = float(os.environ.get(GPU_MEMORY_ENV) or 0)
# Whether queue gpu's tasks run on other workers than verify: executors that route by queue (Celery, Edge) send
# them there; `airflow dags test` (make demo) and the Local executor run every task on one machine.
GPU_ELSEWHERE = any(name in conf.get("core", "executor", fallback="").lower() for name in ("celery", "edge"))
RETRIES = int(os.environ.get("EAGLE3_RETRIES", "2"))
RETRY_DELAY = timedelta(seconds=float(os.environ.get("EAGLE3_RETRY_DELAY_S", "60")))
DRAFT_MODEL = Asset("eagle3://draft_model", group="eagle3")

ROOT = "{{ params.storage_root }}"
RUN = layout.RunLayout(ROOT, DAG_ID, "{{ run_id }}")


def _dataset_assets(manifest: str) -> list[Asset]:
    """One Asset per dataset source of the default manifest, so new data triggers a run."""
    from eagle3.datasets.manifest import source_uris

    return [Asset(uri=uri, name=f"eagle3-dataset-{name}", group="eagle3-datasets")
            for name, uri in source_uris(manifest)]


_assets = _dataset_assets(DEFAULT_MANIFEST)
_cron = CronTriggerTimetable(os.environ.get("EAGLE3_CRON", "0 3 * * 1"), timezone="UTC")
SCHEDULE = AssetOrTimeSchedule(timetable=_cron, assets=_assets) if _assets else _cron

# The trigger form: each Param's default is the demo's setting (eagle3.demo.settings) where it has one,
# else the stage Config's; form_params adapts every schema to the form (bounds, Markdown help; see
# operators/params.py). Add a Param here as the others are; it goes through the same adaptation.
PARAMS = form_params({
    "model": Param(SMOLLM2_ALIAS, type="string", minLength=1, title="Target model",
                   description="A Hugging Face model directory, an s3:// prefix holding one, or the alias "
                               "``smollm2-135m-instruct`` (the bundled SmolLM2)."),
    "manifest": Param(DEFAULT_MANIFEST, type="string", minLength=1, title="Datasets manifest",
                      description="YAML with a top-level ``datasets:`` list (name, source, format, ...). The default is "
                                  "the demo corpus, which ``make airflow`` writes."),
    "storage_root": Param(layout.default_root(), type="string", minLength=1, title="Storage root",
                          description="Local folder or s3://bucket/prefix for every artifact (eagle3.layout)."),
    "max_seq_len": config_param(MergeConfig, "max_seq_len", minimum=16, maximum=1048576, title="Max sequence length"),
    "seed": Param(DEFAULT_SEED, type="integer", minimum=0, title="Seed",
                  description="Seeds regeneration sampling, the merge shuffle and training."),
    "drop": config_param(MergeConfig, "drop", items={"type": "string"}, title="Drop list"),
    "max_reject_share": config_param(TokenizeConfig, "max_reject_share", minimum=0, maximum=1,
                                     title="Max reject share"),
    "regenerate_backend": config_param(RegenerateConfig, "backend", enum=list(REGENERATE_BACKENDS),
                                       title="Regeneration backend"),
    "regenerate_server": config_param(RegenerateConfig, "server", enum=[None, *REGENERATE_SERVERS],
                                      type=["null", "string"], title="Regeneration server",
                                      values_display={"null": "none: the backend above", "vllm": "vLLM",
                                                      "sglang": "SGLang"}),
    "regenerate_restart": config_param(
        RegenerateConfig, "restart", title="Regenerate from scratch",
        description="Discard the answers regenerated earlier (kept under the storage root and shared between "
                    "runs) and regenerate every dataset again. Needed when the regeneration settings above "
                    "differ from those the kept answers were made with; the regenerate task's error says so."),
    "regenerate_max_tokens": config_param(RegenerateConfig, "max_tokens", minimum=1, title="Regeneration max tokens"),
    "regenerate_concurrency": config_param(RegenerateConfig, "concurrency", minimum=1, maximum=1024,
                                           title="Regeneration concurrency"),
    "regenerate_tasks": config_param(DiscoverConfig, "regenerate_tasks", minimum=0, maximum=1024,
                                     title="Regeneration tasks"),
    "draft_vocab_size": config_param(VocabConfig, "draft_vocab_size", minimum=16, title="Draft vocab size"),
    "aux_layers": Param(None, type=["null", "string"], pattern=r"^\s*\d+\s*,\s*\d+\s*,\s*\d+\s*$",
                        title="Aux layers",
                        description="Three target layer ids whose outputs the draft reads, comma-separated "
                                    "(e.g. ``1,14,26``). Empty: the target's default [1, L/2-1, L-4], which "
                                    "is 1,14,26 for the 30-layer SmolLM2."),
    "storage_option": config_param(ExtractConfig, "storage_option", enum=list(storage_options.OPTIONS),
                                   title="Hidden-state storage",
                                   description="Bytes stored per token: " + storage_options.describe()),
    "training_mode": config_param(VerifyConfig, "training_mode", enum=list(TRAINING_MODES), title="Training mode"),
    "online_write_back": config_param(TrainConfig, "write_back", title="Online: write computed samples back"),
    "extract_tokens_per_s": config_param(StatsConfig, "tokens_per_s", exclusiveMinimum=0,
                                         title="Extraction speed estimate"),
    "train_tokens_per_s": config_param(VerifyConfig, "train_tokens_per_s", exclusiveMinimum=0,
                                       title="Draft training speed estimate"),
    "extract_shards": config_param(DiscoverConfig, "extract_shards", minimum=1, maximum=1024,
                                   title="Extraction shards"),
    "precision": config_param(ExtractConfig, "precision", enum=list(PRECISIONS), title="Compute precision",
                              description="Of regenerate (hf), extract, train and evaluate (transformers); "
                                          + PRECISION_SUMMARY),
    "extract_token_budget": config_param(ExtractConfig, "token_budget", minimum=64, title="Extraction token budget"),
    "target_engine": config_param(ExtractConfig, "engine", enum=list(EXTRACT_ENGINES), title="Target engine",
                                  description="What runs the target for extract, and for train when it trains "
                                              "online: transformers in the task, or a vLLM or SGLang server the "
                                              "task starts (online: set EAGLE3_TARGET_SERVER_GPUS so train holds "
                                              "its slots). SGLang fills storage_option fp8-topk only and is "
                                              "untested against a real SGLang (docs/extract.md).",
                                  values_display={"transformers": "transformers (in the task)",
                                                  "vllm": "vLLM (a server the task starts)",
                                                  "sglang": "SGLang (a server the task starts; fp8-topk; untested)"}),
    "target_tensor_parallel_size": config_param(
        ExtractConfig, "tensor_parallel_size", minimum=1, maximum=1024, title="Extraction tensor parallel size",
        description="vLLM and SGLang engines only: GPUs that split every layer of the target (vLLM's "
                    "--tensor-parallel-size, SGLang's --tp-size). Set EAGLE3_TARGET_GPUS to the same count on the "
                    "DAG processor, so extract holds that many slots of pool gpu."),
    "train_token_budget": config_param(
        TrainConfig, "token_budget", minimum=64, title="Training token budget",
        description="The most padded tokens per training micro-batch: the verify gate predicts the device's "
                    "memory (eagle3/memory.py) and gives train the largest budget up to this that fits."),
    "checkpoint_ttt_steps": config_param(TrainConfig, "checkpoint_ttt_steps", title="Checkpoint TTT steps"),
    "sequence_parallel": config_param(TrainConfig, "sequence_parallel", title="Sequence parallel training"),
    "device_memory_gib": config_param(VerifyConfig, "device_memory_gib", default=GPU_MEMORY_GIB or None, minimum=0,
                                      title="Device memory (GiB)"),
    "ttt_length": config_param(TrainConfig, "ttt_length", minimum=1, maximum=16, title="TTT length"),
    "epochs": config_param(TrainConfig, "epochs", minimum=1, title="Epochs"),
    "max_steps": config_param(TrainConfig, "max_steps", minimum=0, title="Max steps"),
    "lr": config_param(TrainConfig, "lr", exclusiveMinimum=0, maximum=1, title="Learning rate"),
    "draft_variant": config_param(TrainConfig, "draft_variant", enum=list(DRAFT_VARIANTS), title="Draft variant"),
    "draft_window": config_param(TrainConfig, "draft_window", minimum=0, title="Draft attention window"),
    "parallel_drafting": config_param(TrainConfig, "parallel_drafting", title="Parallel drafting (P-EAGLE)"),
    "train_time_budget": config_param(TrainConfig, "train_time_budget", minimum=0, title="Training time budget (s)"),
    "run_time_budget": Param(0, type="number", minimum=0, title="Run time budget (s)",
                             description="Seconds the whole run should take (0: none). Training then ends by the "
                                         "run's start plus this, less the reserve below, or runs the training time "
                                         "budget if that is longer: a run whose earlier stages were quick (a bf16 "
                                         "engine extracts faster) trains longer (eagle3/train/budget.py)."),
    "after_train_reserve": Param(300, type="number", minimum=0, title="Reserve after training (s)",
                                 description="With a run time budget: seconds kept for the tasks after train "
                                             "(export, evaluate, publish, report)."),
    "reserve_tokens_per_s": Param(0, type="number", minimum=0, title="Reserve sized at (extraction tok/s)",
                                  description="The extraction rate at which the reserve above was sized (0: the "
                                              "reserve as given). This run's measured extraction rate scales it: "
                                              "a machine that extracts 2x faster keeps half, never less "
                                              "(eagle3/train/budget.py scaled_reserve)."),
    "evaluate_backend": config_param(EvaluateConfig, "backend", enum=list(EVALUATE_BACKENDS),
                                     title="Benchmark engine"),
    "evaluate_compare_with": config_param(EvaluateConfig, "compare_with", items={"type": "string",
                                          "enum": list(EVALUATE_COMPARABLE)}, title="Also benchmark on",
                                          uniqueItems=True),
    "benchmark_prompts": config_param(EvaluateConfig, "prompts", minLength=1, title="Benchmark prompts"),
    "benchmark_limit": config_param(EvaluateConfig, "limit", minimum=1, title="Benchmark prompts limit"),
    "max_new_tokens": config_param(EvaluateConfig, "max_new_tokens", minimum=1, title="Benchmark max new tokens"),
    "steps": config_param(EvaluateConfig, "steps", minimum=1, maximum=16, title="Draft steps"),
}, defaults=demo.PARAMS)
GPU = {"pool": "gpu", "queue": "gpu"}
# verify's choice of training mode (eagle3.verify.mode), as a bool; VerifyOperator pushes it under this key.
ONLINE = "{{ ti.xcom_pull(task_ids='verify', key='training_mode') == 'online' }}"
# The micro-batch verify sized to fit the device (its memory check), capped by the train_token_budget Param.
TRAIN_BUDGET = "{{ ti.xcom_pull(task_ids='verify', key='train_token_budget') or params.train_token_budget }}"
# "1,14,26" -> [1, 14, 26]; empty -> None (the target's default layers). A list Param emptied in the form is
# null: its templates read `params.x or []`.
AUX_LAYERS = "{{ params.aux_layers | layer_ids }}"
# The train and evaluate settings known at trigger time: their tasks' configs, and discover's preflight of them.
TRAIN_SETTINGS = {
    "storage_option": "{{ params.storage_option }}", "ttt_length": "{{ params.ttt_length }}",
    "epochs": "{{ params.epochs }}", "lr": "{{ params.lr }}",
    "checkpoint_ttt_steps": "{{ params.checkpoint_ttt_steps }}",
    "sequence_parallel": "{{ params.sequence_parallel }}", "max_steps": "{{ params.max_steps }}",
    "seed": "{{ params.seed }}", "precision": "{{ params.precision }}", "draft_variant": "{{ params.draft_variant }}",
    "draft_window": "{{ params.draft_window }}", "parallel_drafting": "{{ params.parallel_drafting }}",
    "train_time_budget": "{{ params.train_time_budget }}"}
EVALUATE_SETTINGS = {
    "backend": "{{ params.evaluate_backend }}", "compare_with": "{{ params.evaluate_compare_with or [] }}",
    "prompts": "{{ params.benchmark_prompts }}", "steps": "{{ params.steps }}", "limit": "{{ params.benchmark_limit }}",
    "max_new_tokens": "{{ params.max_new_tokens }}", "precision": "{{ params.precision }}"}


def plan_result(found: dict) -> dict:
    """discover's result as its XCom holds it, or from its file when it was too large for XCom (many shards or
    datasets: Eagle3StageOperator keeps the XCom small)."""
    if "result_file" in found:
        from eagle3 import storage
        from operators.hooks import Eagle3StorageHook

        storage.configure_s3(Eagle3StorageHook().settings)  # an s3 root, as the plan task wrote it
        return storage.read_json(found["result_file"])
    return found


def layer_ids(text: str | None) -> list[int] | None:
    """The aux_layers Param (comma-separated ids, or empty) as the Configs' list."""
    return [int(i) for i in text.split(",")] if text and text.strip() else None


@dag(
    dag_id=DAG_ID,
    schedule=SCHEDULE,
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    render_template_as_native_obj=True,
    user_defined_filters={"layer_ids": layer_ids},
    tags=["eagle3"],
    doc_md=__doc__,
    default_args={"retries": RETRIES, "retry_delay": RETRY_DELAY, "retry_policy": EAGLE3_RETRY_POLICY},
)
def eagle3_train():
    common = {"root": ROOT}
    # Only what comes before every other task sits in the group: a group on both sides of a task is a
    # cycle between groups, and the UI's Graph and Grid then fail (HTTP 500).
    with TaskGroup("discover", tooltip="eagle3.discover: the manifest's datasets and the extraction shards"):
        plan = Eagle3StageOperator(
            task_id="plan", stage="discover", **common,
            config={"manifest": "{{ params.manifest }}", "root": ROOT, "extract_shards": "{{ params.extract_shards }}",
                    "regenerate_tasks": "{{ params.regenerate_tasks }}",
                    # what merge, train and evaluate would refuse only hours later, checked first
                    "preflight": {"drop": "{{ params.drop or [] }}", "model": "{{ params.model }}",
                                  "aux_layers": AUX_LAYERS, "evaluate": EVALUATE_SETTINGS,
                                  "train": TRAIN_SETTINGS}})

        # Mapped tasks expand over a whole XCom value, never over one key of it: one list each.
        @task(task_id="regenerate")
        def regenerate_list(found: dict) -> list:
            return plan_result(found)["regenerate"]

        @task(task_id="tokenize")
        def tokenize_list(found: dict) -> list:
            return plan_result(found)["tokenize"]

        @task(task_id="extract")
        def extract_list(found: dict) -> list:
            return plan_result(found)["extract"]

        to_regenerate, to_tokenize, to_extract = (f(plan.output) for f in (regenerate_list, tokenize_list,
                                                                              extract_list))

    # The target answers (in-process, or a vLLM/SGLang server the task starts): one GPU slot per task, each
    # task one or more datasets (regenerate_tasks).
    regenerate = RegenerateOperator.partial(
        task_id="regenerate", map_index_template="{{ task.mapped.datasets | join(',') }}", **GPU, **common,
        config={"manifest": "{{ params.manifest }}", "out": layout.regenerated(ROOT), "model": "{{ params.model }}",
                "backend": "{{ params.regenerate_backend }}", "server": "{{ params.regenerate_server }}",
                "max_tokens": "{{ params.regenerate_max_tokens }}", "restart": "{{ params.regenerate_restart }}",
                "seed": "{{ params.seed }}", "concurrency": "{{ params.regenerate_concurrency }}",
                "precision": "{{ params.precision }}"},
    ).expand(mapped=to_regenerate)

    tokenize = Eagle3StageOperator.partial(
        task_id="tokenize", stage="tokenize", trigger_rule="none_failed", **common,
        map_index_template="{{ task.mapped.dataset }}",
        config={"manifest": "{{ params.manifest }}", "model": "{{ params.model }}", "out": layout.prepared(ROOT),
                "max_reject_share": "{{ params.max_reject_share }}"},
    ).expand(mapped=to_tokenize)
    regenerate >> tokenize

    stats = Eagle3StageOperator(
        task_id="stats", stage="stats", **common,
        config={"prepared": layout.prepared(ROOT), "out": RUN.folder("stats"), "model": "{{ params.model }}",
                "manifest": "{{ params.manifest }}",  # this run's datasets: the prepared folder is shared
                "max_seq_len": "{{ params.max_seq_len }}", "storage_option": "{{ params.storage_option }}",
                "tokens_per_s": "{{ params.extract_tokens_per_s }}"})
    merge = Eagle3StageOperator(
        task_id="merge", stage="merge", **common,
        config={"prepared": layout.prepared(ROOT), "out": RUN.folder("merged"), "manifest": "{{ params.manifest }}",
                "max_seq_len": "{{ params.max_seq_len }}", "seed": "{{ params.seed }}", "drop": "{{ params.drop or [] }}"})
    verify = VerifyOperator(
        task_id="verify", **common,
        config={"merged": RUN.folder("merged"), "model": "{{ params.model }}", "store": layout.store(ROOT),
                "storage_option": "{{ params.storage_option }}", "tokens_per_s": "{{ params.extract_tokens_per_s }}",
                "aux_layers": AUX_LAYERS,  # the store extract fills: its samples are not priced again
                # what this run merged with: a stale merge of another run fails the gate
                "expect_seed": "{{ params.seed }}", "expect_max_seq_len": "{{ params.max_seq_len }}",
                "expect_drop": "{{ params.drop or [] }}", "expect_manifest": "{{ params.manifest }}",
                "training_mode": "{{ params.training_mode }}", "epochs": "{{ params.epochs }}",
                "train_tokens_per_s": "{{ params.train_tokens_per_s }}",
                # what the memory check sizes (eagle3.verify.sizing)
                "target_engine": "{{ params.target_engine }}",
                "tensor_parallel_size": "{{ params.target_tensor_parallel_size }}",
                "extract_token_budget": "{{ params.extract_token_budget }}",
                "draft_vocab_size": "{{ params.draft_vocab_size }}", "ttt_length": "{{ params.ttt_length }}",
                "train_token_budget": "{{ params.train_token_budget }}",
                "checkpoint_ttt_steps": "{{ params.checkpoint_ttt_steps }}", "precision": "{{ params.precision }}",
                "sequence_parallel": "{{ params.sequence_parallel }}", "train_processes": TRAIN_GPUS,
                "device_memory_gib": "{{ params.device_memory_gib }}", "devices_elsewhere": GPU_ELSEWHERE})
    vocab = Eagle3StageOperator(
        task_id="vocab", stage="vocab", **common,
        config={"merged": RUN.folder("merged"), "out": RUN.folder("vocab"),
                "draft_vocab_size": "{{ params.draft_vocab_size }}"})
    # Mapped over the plan's shards; each skips itself when verify chose online training.
    extract = ExtractOperator.partial(
        task_id="extract", map_index_template="{{ task.mapped.shard }}", online=ONLINE, pool_slots=TARGET_GPUS,
        **GPU, **common,
        config={"merged": RUN.folder("merged"), "model": "{{ params.model }}", "out": layout.store(ROOT),
                "aux_layers": AUX_LAYERS, "storage_option": "{{ params.storage_option }}",
                "token_budget": "{{ params.extract_token_budget }}", "precision": "{{ params.precision }}",
                "engine": "{{ params.target_engine }}",
                "tensor_parallel_size": "{{ params.target_tensor_parallel_size }}"},
    ).expand(mapped=to_extract)

    train = TrainOperator(
        task_id="train", nproc=TRAIN_GPUS, pool_slots=TRAIN_SLOTS, trigger_rule="none_failed",
        run_time_budget="{{ params.run_time_budget }}", after_train_reserve="{{ params.after_train_reserve }}",
        reserve_tokens_per_s="{{ params.reserve_tokens_per_s }}",
        **GPU, **common,
        config={"store": layout.store(ROOT), "aux_layers": AUX_LAYERS,
                "merged": RUN.folder("merged"), "vocab": RUN.folder("vocab"), "out": RUN.folder("checkpoint"),
                "model": "{{ params.model }}", "token_budget": TRAIN_BUDGET, **TRAIN_SETTINGS,
                "online": ONLINE, "write_back": "{{ params.online_write_back and " + ONLINE[3:],
                # online: the target in target_engine (a vLLM or SGLang server on its own devices, or in-process)
                "target_engine": "{{ params.target_engine if " + ONLINE[3:-3] + " else 'transformers' }}",
                "target_tensor_parallel_size": "{{ params.target_tensor_parallel_size if " + ONLINE[3:-3]
                                               + " else 1 }}"})
    export = Eagle3StageOperator(
        task_id="export", stage="export", **common,
        config={"checkpoint": RUN.folder("checkpoint"), "out": RUN.folder("draft")})
    evaluate = Eagle3StageOperator(
        task_id="evaluate", stage="evaluate", **GPU, **common,
        config={"model": "{{ params.model }}", "draft": RUN.folder("draft"), "checkpoint": RUN.folder("checkpoint"),
                "out": RUN.folder("eval"), **EVALUATE_SETTINGS})
    publish = PublishOperator(
        task_id="publish", outlets=[DRAFT_MODEL], **common,
        config={"report": layout.join(RUN.folder("eval"), layout.EVAL_REPORT), "draft": RUN.folder("draft"),
                "registry": layout.registry(ROOT), "run_id": "{{ run_id }}"})
    # The report runs whatever happened upstream (all_done); outcome then fails the run if any task failed.
    report = ReportOperator(
        task_id="report", trigger_rule="all_done", **common,
        config={"root": ROOT, "dag_id": DAG_ID, "run_id": "{{ run_id }}"})
    outcome = OutcomeOperator(task_id=VERDICT_TASK, trigger_rule="all_done", **common)

    tokenize >> stats >> merge >> verify >> vocab >> extract >> train >> export >> evaluate >> publish >> report
    report >> outcome


eagle3_train()
