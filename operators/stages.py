"""One operator per pipeline stage; each makes one call into the eagle3 core.

Light CPU stages (tokenize, stats, merge, verify, vocab, export, publish,
report) call their stage function in the task process. Stages that load the
target model or a GPU (regenerate, extract, train, evaluate) run the `eagle3`
CLI in a supervised subprocess that `on_kill` stops.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from operators.base import Eagle3Operator
from operators.supervised import SupervisedProcess, eagle3_cli

log = logging.getLogger(__name__)


def pull_mapped(ti, task_id: str) -> list[dict]:
    """Every mapped instance's XCom summary as a list (a single instance comes back bare)."""
    value = ti.xcom_pull(task_ids=task_id)
    if value is None:
        return []
    if isinstance(value, dict):
        return [value]
    return [v for v in value if v]


class _SubprocessStage(Eagle3Operator):
    """Runs `argv()` supervised; the child's exit code picks the retry decision."""

    def argv(self, context) -> list[str]:
        raise NotImplementedError

    def result(self, context) -> Any:
        return None

    def execute(self, context):
        env = self.stage_env()
        self._proc = SupervisedProcess(self.argv(context), env=env, log=self.log)
        self._proc.run()
        return self.summary(self.result(context))

    def on_kill(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None:
            proc.kill()


class RegenerateOperator(_SubprocessStage):
    """Replace a dataset's assistant turns with the target's own answers.

    With backend `openai`, the endpoint URL and key come from the Airflow
    connection `openai_conn_id` (host = base URL, password = key), passed to
    the child through its environment, never on the command line.
    """

    template_fields = ("dataset_name", "manifest", "model", "backend", "storage_root", "max_tokens", "seed",
                       "concurrency")

    def __init__(self, *, dataset_name: str, manifest: str, model: str, backend: str = "hf",
                 storage_root: str, max_tokens: int | str = 256, seed: int | str = 42,
                 openai_conn_id: str = "eagle3_openai", concurrency: int | str = 16, **kwargs):
        super().__init__(**kwargs)
        self.dataset_name, self.manifest, self.model, self.backend = dataset_name, manifest, model, backend
        self.storage_root, self.max_tokens, self.seed = storage_root, max_tokens, seed
        self.openai_conn_id, self.concurrency = openai_conn_id, concurrency

    def stage_env(self) -> dict[str, str]:
        env = super().stage_env()
        if self.backend == "openai":
            from airflow.sdk import BaseHook

            conn = BaseHook.get_connection(self.openai_conn_id)
            env["EAGLE3_OPENAI_BASE_URL"] = conn.host or ""
            if conn.password:
                env["EAGLE3_OPENAI_API_KEY"] = conn.password
        return env

    def argv(self, context) -> list[str]:
        from eagle3.regenerate.stage import regenerated_dir

        return eagle3_cli(
            "regenerate", "--manifest", self.manifest, "--dataset", self.dataset_name,
            "--backend", self.backend, "--model", self.model,
            "--out", regenerated_dir(self.storage_root), "--max-tokens", str(self.max_tokens),
            "--seed", str(self.seed), "--concurrency", str(self.concurrency),
        )

    def result(self, context):
        from eagle3 import storage
        from eagle3.regenerate.stage import regenerated_dir

        return storage.read_json(storage.join(regenerated_dir(self.storage_root), self.dataset_name, "stats.json"))


class TokenizeOperator(Eagle3Operator):
    """Tokenize one dataset of the manifest (skipped when its fingerprint is unchanged)."""

    template_fields = ("dataset_name", "manifest", "tokenizer", "out", "max_reject_share", "source_override")

    def __init__(self, *, dataset_name: str, manifest: str, tokenizer: str, out: str,
                 max_reject_share: float | str = 0.05, source_override: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.dataset_name, self.manifest, self.tokenizer, self.out = dataset_name, manifest, tokenizer, out
        self.max_reject_share, self.source_override = max_reject_share, source_override

    def execute(self, context):
        from eagle3.tokenize.stage import tokenize_manifest_dataset

        self.stage_env()
        return self.summary(tokenize_manifest_dataset(
            manifest=self.manifest, dataset=self.dataset_name, tokenizer=self.tokenizer, out=self.out,
            max_reject_share=float(self.max_reject_share), source_override=self.source_override or None,
        ))


class StatsOperator(Eagle3Operator):
    """Per-dataset statistics; logs the table and flags token-heavy datasets."""

    template_fields = ("prepared", "max_seq_len", "model", "out", "tokens_per_s")

    def __init__(self, *, prepared: str, max_seq_len: int | str, model: str, out: str,
                 tokens_per_s: float | str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.prepared, self.max_seq_len, self.model, self.out = prepared, max_seq_len, model, out
        self.tokens_per_s = tokens_per_s

    def execute(self, context):
        from eagle3.stats import DEFAULT_TOKENS_PER_S, run_stats

        self.stage_env()
        result = run_stats(prepared=self.prepared, max_seq_len=int(self.max_seq_len), model=self.model, out=self.out,
                           tokens_per_s=float(self.tokens_per_s or DEFAULT_TOKENS_PER_S))
        self.log.info("dataset statistics:\n%s", result.get("table_text", ""))
        return self.summary({k: v for k, v in result.items() if k != "table_text"})


class MergeOperator(Eagle3Operator):
    """Drop, truncate, dedupe and shuffle the prepared datasets of the manifest."""

    template_fields = ("prepared", "out", "max_seq_len", "seed", "drop", "manifest")

    def __init__(self, *, prepared: str, out: str, max_seq_len: int | str, seed: int | str,
                 drop: str = "", manifest: str | None = None, export_jsonl: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.prepared, self.out, self.max_seq_len, self.seed = prepared, out, max_seq_len, seed
        self.drop, self.manifest, self.export_jsonl = drop, manifest, export_jsonl

    def execute(self, context):
        from eagle3.merge import MergeConfig, merge

        self.stage_env()
        datasets, drop = [], {d for d in str(self.drop).split(",") if d}
        if self.manifest:
            # The prepared folder is shared between runs: merge only this manifest's datasets.
            from eagle3.tokenize.manifest import load_manifest

            specs = load_manifest(self.manifest, check_sources=False)
            datasets = [d.name for d in specs]
            drop |= {d.name for d in specs if d.drop}
        cfg = MergeConfig(prepared=self.prepared, out=self.out, max_seq_len=int(self.max_seq_len),
                          seed=int(self.seed), drop=tuple(sorted(drop)), export_jsonl=self.export_jsonl,
                          datasets=tuple(datasets))
        return self.summary(merge(cfg))


class VerifyOperator(Eagle3Operator):
    """The gate: a failed check fails the DAG here, before extraction, with no retry."""

    template_fields = ("merged", "model", "store", "storage_option", "tokens_per_s")

    def __init__(self, *, merged: str, model: str, store: str, storage_option: str = "bf16",
                 tokens_per_s: float | str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.merged, self.model, self.store, self.storage_option = merged, model, store, storage_option
        self.tokens_per_s = tokens_per_s

    def execute(self, context):
        from eagle3.errors import GateFailed
        from eagle3.verify import VerifyConfig, verify

        self.stage_env()
        # Bytes per stored value and whether `last` is stored, per storage option (docs/extract.md).
        bytes_per_value, store_last = {"bf16": (2, True), "fp8": (1, True), "fp8-topk": (1, False)}[
            self.storage_option]
        try:
            extra = {"tokens_per_s": float(self.tokens_per_s)} if self.tokens_per_s else {}
            result = verify(VerifyConfig(merged=self.merged, model=self.model, store=self.store,
                                         bytes_per_value=bytes_per_value, store_last=store_last, **extra))
        except GateFailed as e:
            raise AirflowFailException(f"verify gate failed: {e}") from e
        return self.summary(result)


class VocabOperator(Eagle3Operator):
    """Build the draft vocab map (d2t/t2d) from loss-token frequencies."""

    template_fields = ("merged", "out", "draft_vocab_size")

    def __init__(self, *, merged: str, out: str, draft_vocab_size: int | str, **kwargs):
        super().__init__(**kwargs)
        self.merged, self.out, self.draft_vocab_size = merged, out, draft_vocab_size

    def execute(self, context):
        from eagle3.vocab import VocabConfig, build_vocab

        self.stage_env()
        return self.summary(build_vocab(VocabConfig(merged=self.merged, out=self.out,
                                                    draft_vocab_size=int(self.draft_vocab_size))))


class ExtractOperator(_SubprocessStage):
    """Extract one shard group of hidden states (mapped; pool `gpu`, queue `gpu`)."""

    template_fields = ("merged", "model", "out", "shard", "layers", "storage_option", "token_budget")

    def __init__(self, *, merged: str, model: str, out: str, shard: str = "0/1", layers: str = "",
                 storage_option: str = "bf16", token_budget: int | str = 8192, device: str = "auto", **kwargs):
        super().__init__(**kwargs)
        self.merged, self.model, self.out, self.shard = merged, model, out, shard
        self.layers, self.storage_option, self.token_budget, self.device = layers, storage_option, token_budget, device

    def argv(self, context) -> list[str]:
        import tempfile

        self._summary_path = tempfile.mktemp(prefix="eagle3-extract-", suffix=".json")
        args = ["extract", "--merged", self.merged, "--model", self.model, "--out", self.out,
                "--shard", self.shard, "--storage", self.storage_option, "--token-budget", str(self.token_budget),
                "--device", self.device, "--summary-json", self._summary_path]
        if self.layers:
            args += ["--layers", self.layers]
        return eagle3_cli(*args)

    def result(self, context):
        import json
        import os

        with open(self._summary_path) as f:
            summary = json.load(f)
        os.unlink(self._summary_path)
        return summary


class TrainOperator(_SubprocessStage):
    """Train the draft under torchrun (pool `gpu` with pool_slots = nproc)."""

    template_fields = ("store", "merged", "vocab", "out", "model", "ttt_length", "epochs", "lr",
                       "token_budget", "max_steps", "seed", "layers", "storage_option")

    def __init__(self, *, store: str, merged: str, vocab: str, out: str, model: str, ttt_length: int | str = 7,
                 epochs: int | str = 1, lr: float | str = 3e-4, token_budget: int | str = 8192,
                 max_steps: int | str = 0, seed: int | str = 42, layers: str = "", storage_option: str = "bf16",
                 nproc: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.store, self.merged, self.vocab, self.out, self.model = store, merged, vocab, out, model
        self.ttt_length, self.epochs, self.lr, self.token_budget = ttt_length, epochs, lr, token_budget
        self.max_steps, self.seed, self.layers, self.storage_option = max_steps, seed, layers, storage_option
        self.nproc = nproc

    def argv(self, context) -> list[str]:
        # Train on exactly the store folder extraction filled for this run (a root may hold
        # stores of other models, layers or storage options).
        extracted = pull_mapped(context["ti"], "extract")
        store = extracted[0]["store"] if extracted else self.store
        args = ["train", "--store", store, "--merged", self.merged, "--vocab", self.vocab,
                "--out", self.out, "--target", self.model, "--ttt-length", str(self.ttt_length),
                "--epochs", str(self.epochs), "--lr", str(self.lr), "--token-budget", str(self.token_budget),
                "--seed", str(self.seed)]
        if int(self.max_steps):
            args += ["--max-steps", str(self.max_steps)]
        if self.nproc > 1:
            # `eagle3 train --nproc` runs torchrun itself and keeps the exit codes (75 OOM, 2 bad
            # input); a bare torchrun exits 1 whatever its workers returned.
            args += ["--nproc", str(self.nproc)]
        return eagle3_cli(*args)

    def result(self, context):
        from eagle3 import storage

        latest = storage.read_json(storage.join(self.out, "latest.json"))
        state = storage.read_json(storage.join(self.out, latest["dir"], "train_state.json"))
        return {"checkpoint": storage.join(self.out, latest["dir"]), "step": latest["step"],
                **{k: state.get(k) for k in ("micro_batch", "token_budget", "grad_accum", "epoch")}}


class ExportOperator(Eagle3Operator):
    """Write the SGLang-loadable EAGLE3 draft directory from the last checkpoint."""

    template_fields = ("checkpoint", "out")

    def __init__(self, *, checkpoint: str, out: str, **kwargs):
        super().__init__(**kwargs)
        self.checkpoint, self.out = checkpoint, out

    def execute(self, context):
        from eagle3.export import ExportConfig, export

        self.stage_env()
        return self.summary(export(ExportConfig(checkpoint=self.checkpoint, out=self.out)))


class EvaluateOperator(_SubprocessStage):
    """Real speculative decoding against the target: τ, speed, lossless check."""

    template_fields = ("target", "draft", "checkpoint", "prompts", "steps", "limit", "max_new_tokens", "out")

    def __init__(self, *, target: str, draft: str, out: str, prompts: str = "humaneval", steps: int | str = 3,
                 limit: int | str = 20, max_new_tokens: int | str = 128, checkpoint: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.target, self.draft, self.out, self.prompts = target, draft, out, prompts
        self.steps, self.limit, self.max_new_tokens, self.checkpoint = steps, limit, max_new_tokens, checkpoint

    def argv(self, context) -> list[str]:
        args = ["evaluate", "--target", self.target, "--draft", self.draft, "--prompts", self.prompts,
                "--steps", str(self.steps), "--limit", str(self.limit),
                "--max-new-tokens", str(self.max_new_tokens), "--out", self.out]
        if self.checkpoint:
            args += ["--checkpoint", self.checkpoint]
        return eagle3_cli(*args)

    def result(self, context):
        from eagle3 import storage

        report = storage.read_json(storage.join(self.out, "report.json"))
        keys = ("acceptance_length", "lossless", "speedup", "tokens_per_s_spec", "tokens_per_s_base",
                "accept_rate_by_position", "sim_accept_len")
        return {k: report.get(k) for k in keys}


class PublishOperator(Eagle3Operator):
    """Publish the draft (and emit the draft_model Asset event) only if it beats the best so far."""

    template_fields = ("report", "draft", "registry")

    def __init__(self, *, report: str, draft: str, registry: str, **kwargs):
        super().__init__(**kwargs)
        self.report, self.draft, self.registry = report, draft, registry

    def execute(self, context):
        from eagle3.evaluate.publish import publish

        self.stage_env()
        decision = publish(report=self.report, draft=self.draft, registry=self.registry,
                           run_id=context["run_id"])
        if not decision.get("published"):
            # Skipping the task also suppresses the outlet's Asset event.
            raise AirflowSkipException(f"not published: {decision.get('reason')}")
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {k: decision.get(k) for k in ("location", "acceptance_length")}
        return self.summary(decision)


class ReportOperator(Eagle3Operator):
    """Write the run's report (report.json, PNG plots, report.html), what was reused,
    and run_summary.json, which the UI page reads."""

    template_fields = ("run_dir", "prepared")

    def __init__(self, *, run_dir: str, prepared: str, **kwargs):
        super().__init__(**kwargs)
        self.run_dir, self.prepared = run_dir, prepared

    def execute(self, context):
        from eagle3 import storage
        from eagle3.evaluate.report import write_run_report

        self.stage_env()
        ti = context["ti"]
        summaries = {tid: ti.xcom_pull(task_ids=tid) for tid in
                     ("stats", "merge", "verify", "vocab", "train", "export", "evaluate", "publish")}
        tokenized = pull_mapped(ti, "tokenize")
        extracted = pull_mapped(ti, "extract")
        reuse = {
            "tokenize": {s["dataset"]: "reused" if s.get("reused") else "tokenized" for s in tokenized},
            "extracted_samples": sum(s.get("samples_extracted", 0) for s in extracted),
            "reused_samples": sum(s.get("samples_skipped", 0) for s in extracted),
            "extracted_tokens": sum(s.get("tokens", 0) for s in extracted),
        }
        storage.write_json(storage.join(self.run_dir, "report", "reuse.json"), reuse)
        report = write_run_report(run_dir=self.run_dir, prepared=self.prepared)
        storage.write_json(storage.join(self.run_dir, "run_summary.json"), self.summary({
            "dag_id": context["dag"].dag_id, "run_id": context["run_id"],
            "report_dir": report["out"], "paths": {"prepared": self.prepared, "report": report["out"]},
            "summaries": {**summaries, "tokenize": tokenized, "extract": extracted}, "reused": reuse,
        }))
        self.log.info("report: %s; reused: %s", report["out"], reuse)
        return self.summary({**report, "reuse": reuse})
