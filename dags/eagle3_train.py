"""eagle3_train: raw conversation datasets → trained, exported, benchmarked EAGLE-3 draft.

discover ─► regenerate[ds] ─► tokenize[ds] ─► stats ─► merge ─► verify ─► vocab ─► extract[shard] ─► train
         ─► export ─► evaluate ─► publish ─► report

Wiring only: every task is the stage of the same name in the eagle3 core library
(``eagle3.<task>``, exposing ``<task>(cfg)``), run by one operator shape. Params take their
defaults and descriptions from the stage Configs, and templates render as native objects,
so a value keeps its type from the trigger form to the Config. Where artifacts go is
eagle3.layout: a run's own folders under {storage_root}/runs/eagle3_train/{run_id}/, the
tokenized datasets and the hidden-state store shared between runs, so a re-run redoes only
what changed. Nothing heavy is imported here (parsing stays well under 0.3 s).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, TaskGroup, dag, task

from eagle3 import layout, storage_options
from eagle3.devices import PRECISION_SUMMARY, PRECISIONS
from eagle3.config import DEFAULT_SEED
from eagle3.discover import DiscoverConfig
from eagle3.evaluate.config import BACKENDS as EVALUATE_BACKENDS
from eagle3.evaluate.config import COMPARABLE as EVALUATE_COMPARABLE
from eagle3.evaluate.config import EvaluateConfig
from eagle3.extract.config import ExtractConfig
from eagle3.merge.config import MergeConfig
from eagle3.regenerate.config import BACKENDS as REGENERATE_BACKENDS
from eagle3.regenerate.config import SERVERS as REGENERATE_SERVERS
from eagle3.regenerate.config import RegenerateConfig
from eagle3.stats import StatsConfig
from eagle3.target import SMOLLM2_ALIAS
from eagle3.tokenize.config import TokenizeConfig
from eagle3.train.config import TrainConfig
from eagle3.verify.config import VerifyConfig
from eagle3.verify.mode import MODES as TRAINING_MODES
from eagle3.vocab.config import VocabConfig
from operators.params import config_param
from operators.retry import EAGLE3_RETRY_POLICY
from operators.stage import Eagle3StageOperator, PublishOperator, RegenerateOperator, TrainOperator

DAG_ID = "eagle3_train"
# The manifest whose dataset sources are the DAG's Assets (read at parse time; YAML only).
DEFAULT_MANIFEST = os.environ.get("EAGLE3_MANIFEST", str(Path(__file__).resolve().parents[1] / "artifacts/demo/manifest.yaml"))
TRAIN_GPUS = int(os.environ.get("EAGLE3_TRAIN_GPUS", "1"))  # pool_slots of train; ≤ pool size
# GPUs the target's forward needs: online training runs it inside the train task, so train holds that many too
TARGET_GPUS = int(os.environ.get("EAGLE3_TARGET_GPUS", "1"))
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

PARAMS = {
    "model": Param(SMOLLM2_ALIAS, type="string", minLength=1, title="Target model",
                   description="HF model directory, s3:// prefix, or the alias smollm2-135m-instruct."),
    "manifest": Param(DEFAULT_MANIFEST, type="string", minLength=1, title="Datasets manifest",
                      description="YAML with a top-level `datasets:` list (name, source, format, ...)."),
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
                                      type=["null", "string"], title="Regeneration server"),
    "regenerate_max_tokens": config_param(RegenerateConfig, "max_tokens", minimum=1, title="Regeneration max tokens"),
    "regenerate_concurrency": config_param(RegenerateConfig, "concurrency", minimum=1, maximum=1024,
                                           title="Regeneration concurrency"),
    "draft_vocab_size": config_param(VocabConfig, "draft_vocab_size", minimum=16, title="Draft vocab size"),
    "aux_layers": config_param(ExtractConfig, "layers", items={"type": "integer", "minimum": 0}, minItems=3,
                               maxItems=3, title="Aux layers"),
    "storage_option": config_param(ExtractConfig, "storage", enum=list(storage_options.OPTIONS),
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
    "train_token_budget": config_param(TrainConfig, "token_budget", minimum=64, title="Training token budget"),
    "ttt_length": config_param(TrainConfig, "ttt_length", minimum=1, maximum=16, title="TTT length"),
    "epochs": config_param(TrainConfig, "epochs", minimum=1, title="Epochs"),
    "max_steps": config_param(TrainConfig, "max_steps", minimum=0, title="Max steps"),
    "lr": config_param(TrainConfig, "lr", exclusiveMinimum=0, maximum=1, title="Learning rate"),
    "evaluate_backend": config_param(EvaluateConfig, "backend", enum=list(EVALUATE_BACKENDS),
                                     title="Benchmark engine"),
    "evaluate_compare_with": config_param(EvaluateConfig, "compare_with", items={"type": "string",
                                          "enum": list(EVALUATE_COMPARABLE)}, title="Also benchmark on"),
    "benchmark_prompts": config_param(EvaluateConfig, "prompts", minLength=1, title="Benchmark prompts"),
    "benchmark_limit": config_param(EvaluateConfig, "limit", minimum=1, title="Benchmark prompts limit"),
    "max_new_tokens": config_param(EvaluateConfig, "max_new_tokens", minimum=1, title="Benchmark max new tokens"),
    "steps": config_param(EvaluateConfig, "steps", minimum=1, maximum=16, title="Draft steps"),
}
GPU = {"pool": "gpu", "queue": "gpu"}
ONLINE = "{{ ti.xcom_pull(task_ids='discover.training_mode') == 'online' }}"  # verify's choice, as a bool


# Training mode: verify decides (eagle3.verify.mode); online maps extract over no shard, which skips it.
@task(task_id="training_mode")
def _training_mode(verdict: dict) -> str:
    if "training_mode" not in verdict:  # a verdict too big for XCom is kept in the run folder
        from eagle3 import storage

        verdict = storage.read_json(verdict["result_file"])
    return verdict["training_mode"]["mode"]


@task(task_id="extract_shards")
def _offline_shards(shards: list, mode: str) -> list:
    return [] if mode == "online" else shards


@dag(
    dag_id=DAG_ID,
    schedule=SCHEDULE,
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["eagle3"],
    doc_md=__doc__,
    default_args={"retries": RETRIES, "retry_delay": RETRY_DELAY, "retry_policy": EAGLE3_RETRY_POLICY},
)
def eagle3_train():
    common = {"root": ROOT}
    with TaskGroup("discover", tooltip="eagle3.discover: the manifest's datasets and the extraction shards") as found:
        plan = Eagle3StageOperator(
            task_id="plan", stage="discover", **common,
            config={"manifest": "{{ params.manifest }}", "root": ROOT, "extract_shards": "{{ params.extract_shards }}"})

        # Mapped tasks expand over a whole XCom value, never over one key of it: one list each.
        @task(task_id="regenerate")
        def regenerate_list(found: dict) -> list:
            return found["regenerate"]

        @task(task_id="tokenize")
        def tokenize_list(found: dict) -> list:
            return found["tokenize"]

        @task(task_id="extract")
        def extract_list(found: dict) -> list:
            return found["extract"]

        to_regenerate, to_tokenize, to_extract = (f(plan.output) for f in (regenerate_list, tokenize_list,
                                                                              extract_list))

    regenerate = RegenerateOperator.partial(
        task_id="regenerate", map_index_template="{{ task.mapped.datasets[0] }}", **common,
        config={"manifest": "{{ params.manifest }}", "out": layout.regenerated(ROOT), "model": "{{ params.model }}",
                "backend": "{{ params.regenerate_backend }}", "server": "{{ params.regenerate_server }}",
                "max_tokens": "{{ params.regenerate_max_tokens }}",
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
                "max_seq_len": "{{ params.max_seq_len }}", "storage": "{{ params.storage_option }}",
                "tokens_per_s": "{{ params.extract_tokens_per_s }}"})
    merge = Eagle3StageOperator(
        task_id="merge", stage="merge", **common,
        config={"prepared": layout.prepared(ROOT), "out": RUN.folder("merged"), "manifest": "{{ params.manifest }}",
                "max_seq_len": "{{ params.max_seq_len }}", "seed": "{{ params.seed }}", "drop": "{{ params.drop }}"})
    verify = Eagle3StageOperator(
        task_id="verify", stage="verify", **common,
        config={"merged": RUN.folder("merged"), "model": "{{ params.model }}", "store": layout.store(ROOT),
                "storage": "{{ params.storage_option }}", "tokens_per_s": "{{ params.extract_tokens_per_s }}",
                # what this run merged with: a stale merge of another run fails the gate
                "expect_seed": "{{ params.seed }}", "expect_max_seq_len": "{{ params.max_seq_len }}",
                "expect_drop": "{{ params.drop }}", "expect_manifest": "{{ params.manifest }}",
                "training_mode": "{{ params.training_mode }}", "epochs": "{{ params.epochs }}",
                "train_tokens_per_s": "{{ params.train_tokens_per_s }}"})
    vocab = Eagle3StageOperator(
        task_id="vocab", stage="vocab", **common,
        config={"merged": RUN.folder("merged"), "out": RUN.folder("vocab"),
                "draft_vocab_size": "{{ params.draft_vocab_size }}"})

    with found:  # the plan's selectors: the shards to extract, none when verify chose online training
        shards = _offline_shards(to_extract, _training_mode(verify.output))
    extract = Eagle3StageOperator.partial(
        task_id="extract", stage="extract", map_index_template="{{ task.mapped.shard }}", **GPU, **common,
        config={"merged": RUN.folder("merged"), "model": "{{ params.model }}", "out": layout.store(ROOT),
                "layers": "{{ params.aux_layers }}", "storage": "{{ params.storage_option }}",
                "token_budget": "{{ params.extract_token_budget }}", "precision": "{{ params.precision }}"},
    ).expand(mapped=shards)

    train = TrainOperator(
        task_id="train", nproc=TRAIN_GPUS, pool_slots=max(TRAIN_GPUS, TARGET_GPUS), trigger_rule="none_failed",
        **GPU, **common,
        config={"store": layout.store(ROOT), "layers": "{{ params.aux_layers }}", "storage": "{{ params.storage_option }}",
                "merged": RUN.folder("merged"), "vocab": RUN.folder("vocab"), "out": RUN.folder("checkpoint"),
                "model": "{{ params.model }}", "ttt_length": "{{ params.ttt_length }}", "epochs": "{{ params.epochs }}",
                "lr": "{{ params.lr }}", "token_budget": "{{ params.train_token_budget }}",
                "max_steps": "{{ params.max_steps }}", "seed": "{{ params.seed }}",
                "precision": "{{ params.precision }}",
                "online": ONLINE, "write_back": "{{ params.online_write_back and " + ONLINE[3:]})
    export = Eagle3StageOperator(
        task_id="export", stage="export", **common,
        config={"checkpoint": RUN.folder("checkpoint"), "out": RUN.folder("draft")})
    evaluate = Eagle3StageOperator(
        task_id="evaluate", stage="evaluate", **GPU, **common,
        config={"model": "{{ params.model }}", "draft": RUN.folder("draft"), "checkpoint": RUN.folder("checkpoint"),
                "out": RUN.folder("eval"), "backend": "{{ params.evaluate_backend }}",
                "compare_with": "{{ params.evaluate_compare_with }}",
                "prompts": "{{ params.benchmark_prompts }}", "steps": "{{ params.steps }}",
                "limit": "{{ params.benchmark_limit }}", "max_new_tokens": "{{ params.max_new_tokens }}",
                "precision": "{{ params.precision }}"})
    publish = PublishOperator(
        task_id="publish", outlets=[DRAFT_MODEL], **common,
        config={"report": layout.join(RUN.folder("eval"), "report.json"), "draft": RUN.folder("draft"),
                "registry": layout.registry(ROOT), "run_id": "{{ run_id }}"})
    report = Eagle3StageOperator(
        task_id="report", stage="report", trigger_rule="all_done", **common,
        config={"root": ROOT, "dag_id": DAG_ID, "run_id": "{{ run_id }}"})

    tokenize >> stats >> merge >> verify >> vocab >> extract >> train >> export >> evaluate >> publish >> report


eagle3_train()
