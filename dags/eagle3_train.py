"""eagle3_train: raw conversation datasets → trained, exported, benchmarked EAGLE-3 draft.

discover ─► regenerate[ds] ─► tokenize[ds] ─► stats ─► merge ─► verify ─► vocab ─► extract[shard] ─► train
         ─► export ─► evaluate ─► publish ─► report

Wiring only: every task is an operator from operators/ that calls the eagle3
core library. Nothing heavy is imported here (parsing stays well under 0.3 s).
Artifacts of a run live under {storage_root}/runs/eagle3_train/{run_id}/;
the tokenized datasets and the hidden-state store are shared between runs, so
a re-run redoes only what changed.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task

from operators.retry import EAGLE3_RETRY_POLICY
from operators.stages import (
    EvaluateOperator,
    ExportOperator,
    ExtractOperator,
    MergeOperator,
    PublishOperator,
    RegenerateOperator,
    ReportOperator,
    StatsOperator,
    TokenizeOperator,
    TrainOperator,
    VerifyOperator,
    VocabOperator,
)

DAG_ID = "eagle3_train"
# The manifest whose dataset sources are the DAG's Assets (read at parse time; YAML only).
DEFAULT_MANIFEST = os.environ.get("EAGLE3_MANIFEST", str(Path(__file__).resolve().parents[1] / "artifacts/demo/manifest.yaml"))
DEFAULT_ROOT = os.environ.get(
    "EAGLE3_ARTIFACTS", str(Path(os.environ.get("AIRFLOW_HOME", "airflow_home")).resolve().parent / "artifacts")
)
TRAIN_GPUS = int(os.environ.get("EAGLE3_TRAIN_GPUS", "1"))  # pool_slots of train; ≤ pool size
RETRIES = int(os.environ.get("EAGLE3_RETRIES", "2"))
RETRY_DELAY = timedelta(seconds=float(os.environ.get("EAGLE3_RETRY_DELAY_S", "60")))
DRAFT_MODEL = Asset("eagle3://draft_model", group="eagle3")

RUN = "{{ params.storage_root }}/runs/" + DAG_ID + "/{{ run_id }}"
PREPARED = "{{ params.storage_root }}/prepared"
STORE = "{{ params.storage_root }}/store"


def _dataset_assets(manifest: str) -> list[Asset]:
    """One Asset per dataset source of the default manifest, so new data triggers a run."""
    import yaml

    try:
        with open(manifest) as f:
            spec = yaml.safe_load(f) or {}
    except OSError:
        return []
    base = Path(manifest).resolve().parent
    assets = []
    for ds in spec.get("datasets") or []:
        src = str(ds.get("source", ""))
        if not src:
            continue
        uri = src if "://" in src else f"file://{(base / src).resolve()}"
        assets.append(Asset(uri=uri, name=f"eagle3-dataset-{ds.get('name')}", group="eagle3-datasets"))
    return assets


_assets = _dataset_assets(DEFAULT_MANIFEST)
_cron = CronTriggerTimetable(os.environ.get("EAGLE3_CRON", "0 3 * * 1"), timezone="UTC")
SCHEDULE = AssetOrTimeSchedule(timetable=_cron, assets=_assets) if _assets else _cron

PARAMS = {
    "model": Param("smollm2-135m-instruct", type="string", minLength=1, title="Target model",
                   description="HF model directory, s3:// prefix, or the alias smollm2-135m-instruct."),
    "manifest": Param(DEFAULT_MANIFEST, type="string", minLength=1, title="Datasets manifest",
                      description="YAML with a top-level `datasets:` list (name, source, format, ...)."),
    "storage_root": Param(DEFAULT_ROOT, type="string", minLength=1, title="Storage root",
                          description="Local folder or s3://bucket/prefix for every artifact."),
    "max_seq_len": Param(8192, type="integer", minimum=16, maximum=1048576, title="Max sequence length",
                         description="Samples are truncated to this many tokens at merge."),
    "seed": Param(42, type="integer", minimum=0, title="Seed", description="Shuffle and training seed."),
    "drop": Param([], type="array", items={"type": "string"}, title="Drop list",
                  description="Dataset names left out at merge."),
    "max_reject_share": Param(0.05, type="number", minimum=0, maximum=1, title="Max reject share",
                              description="A dataset fails if more of its lines than this are refused."),
    "regenerate_backend": Param("hf", type="string", enum=["hf", "openai"], title="Regeneration backend",
                                description="hf: in-process transformers; openai: endpoint of connection eagle3_openai."),
    "regenerate_max_tokens": Param(256, type="integer", minimum=1, title="Regeneration max tokens",
                                   description="Max new tokens per regenerated assistant turn."),
    "regenerate_concurrency": Param(16, type="integer", minimum=1, maximum=1024, title="Regeneration concurrency",
                                    description="Conversations in flight (openai) or the generate batch (hf)."),
    "draft_vocab_size": Param(8192, type="integer", minimum=16, title="Draft vocab size",
                              description="Vd: the draft lm_head covers the Vd most frequent loss tokens."),
    "aux_layers": Param(None, type=["null", "array"], items={"type": "integer", "minimum": 0},
                        minItems=3, maxItems=3, title="Aux layers",
                        description="Target layers whose outputs feed the draft; empty = [1, L/2-1, L-4]."),
    "storage_option": Param("bf16", type="string", enum=["bf16", "fp8", "fp8-topk"], title="Hidden-state storage",
                            description="bf16: 8H bytes/token (baseline); fp8: 4H+8; fp8-topk: 3H+102 "
                                        "(fp8 aux + the target's top-16 log-probs instead of `last`)."),
    "extract_tokens_per_s": Param(20000, type="number", exclusiveMinimum=0, title="Extraction speed estimate",
                                  description="Tokens per second the whole extraction reaches (all shards "
                                              "together): stats and verify turn it into the extraction hours "
                                              "they print before anything is extracted."),
    "extract_shards": Param(1, type="integer", minimum=1, maximum=1024, title="Extraction shards",
                            description="Number of mapped extraction tasks (pool gpu caps how many run at once)."),
    "token_budget": Param(8192, type="integer", minimum=64, title="Token budget",
                          description="Tokens per micro-batch for extraction and training (halved on OOM)."),
    "ttt_length": Param(7, type="integer", minimum=1, maximum=16, title="TTT length",
                        description="Training-time-test steps."),
    "epochs": Param(1, type="integer", minimum=1, title="Epochs", description="Passes over the training data."),
    "max_steps": Param(0, type="integer", minimum=0, title="Max steps",
                       description="Stop training after this many optimizer steps (0 = no limit)."),
    "lr": Param(3e-4, type="number", exclusiveMinimum=0, maximum=1, title="Learning rate",
                description="Peak AdamW learning rate (cosine schedule with warmup)."),
    "benchmark_prompts": Param("humaneval,chat", type="string", minLength=1, title="Benchmark prompts",
                               description="Comma-separated prompt sets: humaneval, chat (bundled held-out "
                                           "questions) or JSONL files held out from training. The first set's τ "
                                           "is the headline and what the publish gate compares."),
    "benchmark_limit": Param(20, type="integer", minimum=1, title="Benchmark prompts limit",
                             description="How many prompts of each set to decode."),
    "max_new_tokens": Param(128, type="integer", minimum=1, title="Benchmark max new tokens",
                            description="Tokens generated per benchmark prompt."),
    "steps": Param(3, type="integer", minimum=1, maximum=16, title="Draft steps",
                   description="Speculative chain length k (at most k+1 tokens per verification)."),
}


@dag(
    dag_id=DAG_ID,
    schedule=SCHEDULE,
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    tags=["eagle3"],
    doc_md=__doc__,
    default_args={"retries": RETRIES, "retry_delay": RETRY_DELAY, "retry_policy": EAGLE3_RETRY_POLICY},
)
def eagle3_train():
    @task
    def discover(params=None, run_id=None) -> dict:
        """Validate the manifest and list the datasets; says where regenerated sources will be."""
        from eagle3.regenerate.stage import regenerated_source
        from eagle3.tokenize.manifest import load_manifest

        specs = load_manifest(params["manifest"])
        tokenize_kwargs, regen = [], []
        for ds in specs:
            override = None
            if ds.regenerate:
                override = regenerated_source(params["storage_root"], ds.name)
                regen.append({"dataset_name": ds.name})
            tokenize_kwargs.append({"dataset_name": ds.name, "source_override": override})
        return {"tokenize": tokenize_kwargs, "regenerate": regen}

    found = discover()

    @task
    def pick(found: dict, key: str) -> list:
        return found[key]

    regenerate = RegenerateOperator.partial(
        task_id="regenerate", manifest="{{ params.manifest }}", model="{{ params.model }}",
        backend="{{ params.regenerate_backend }}", storage_root="{{ params.storage_root }}",
        max_tokens="{{ params.regenerate_max_tokens }}", seed="{{ params.seed }}",
        concurrency="{{ params.regenerate_concurrency }}",
        map_index_template="{{ task.dataset_name }}",
    ).expand_kwargs(pick.override(task_id="datasets_to_regenerate")(found, "regenerate"))

    tokenize = TokenizeOperator.partial(
        task_id="tokenize", manifest="{{ params.manifest }}", tokenizer="{{ params.model }}", out=PREPARED,
        max_reject_share="{{ params.max_reject_share }}", trigger_rule="none_failed",
        map_index_template="{{ task.dataset_name }}",
    ).expand_kwargs(pick.override(task_id="datasets_to_tokenize")(found, "tokenize"))
    regenerate >> tokenize

    stats = StatsOperator(task_id="stats", prepared=PREPARED, max_seq_len="{{ params.max_seq_len }}",
                          model="{{ params.model }}", out=RUN + "/stats",
                          tokens_per_s="{{ params.extract_tokens_per_s }}")
    merge = MergeOperator(
        task_id="merge", prepared=PREPARED, out=RUN + "/merged", max_seq_len="{{ params.max_seq_len }}",
        seed="{{ params.seed }}", drop="{{ params.drop | join(',') }}", manifest="{{ params.manifest }}",
    )
    verify = VerifyOperator(task_id="verify", merged=RUN + "/merged", model="{{ params.model }}",
                            store=STORE, storage_option="{{ params.storage_option }}",
                            tokens_per_s="{{ params.extract_tokens_per_s }}")
    vocab = VocabOperator(task_id="vocab", merged=RUN + "/merged", out=RUN + "/vocab",
                          draft_vocab_size="{{ params.draft_vocab_size }}")

    @task
    def shards(params=None) -> list[str]:
        n = int(params["extract_shards"])
        return [f"{i}/{n}" for i in range(n)]

    extract = ExtractOperator.partial(
        task_id="extract", merged=RUN + "/merged", model="{{ params.model }}", out=STORE,
        layers="{{ params.aux_layers | join(',') if params.aux_layers else '' }}",
        storage_option="{{ params.storage_option }}", token_budget="{{ params.token_budget }}",
        pool="gpu", queue="gpu", map_index_template="{{ task.shard }}",
    ).expand(shard=shards())

    train = TrainOperator(
        task_id="train", store=STORE, merged=RUN + "/merged", vocab=RUN + "/vocab", out=RUN + "/checkpoint",
        model="{{ params.model }}", ttt_length="{{ params.ttt_length }}", epochs="{{ params.epochs }}",
        lr="{{ params.lr }}", token_budget="{{ params.token_budget }}", max_steps="{{ params.max_steps }}",
        seed="{{ params.seed }}", layers="{{ params.aux_layers | join(',') if params.aux_layers else '' }}",
        storage_option="{{ params.storage_option }}",
        nproc=TRAIN_GPUS, pool="gpu", pool_slots=TRAIN_GPUS, queue="gpu",
    )
    export = ExportOperator(task_id="export", checkpoint=RUN + "/checkpoint", out=RUN + "/draft")
    evaluate = EvaluateOperator(
        task_id="evaluate", target="{{ params.model }}", draft=RUN + "/draft", checkpoint=RUN + "/checkpoint",
        prompts="{{ params.benchmark_prompts }}", steps="{{ params.steps }}", limit="{{ params.benchmark_limit }}",
        max_new_tokens="{{ params.max_new_tokens }}", out=RUN + "/eval", pool="gpu", queue="gpu",
    )
    publish = PublishOperator(
        task_id="publish", report=RUN + "/eval/report.json", draft=RUN + "/draft",
        registry="{{ params.storage_root }}/registry", outlets=[DRAFT_MODEL],
    )
    report = ReportOperator(task_id="report", run_dir=RUN, prepared=PREPARED, trigger_rule="all_done")

    tokenize >> stats >> merge >> verify >> vocab >> extract >> train >> export >> evaluate >> publish >> report


eagle3_train()
