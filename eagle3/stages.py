"""The one registry of stages and commands: the DAG's tasks and the `eagle3` subcommands.

A DAG stage is one task id = one module ``eagle3.<task>`` exposing ``<task>(cfg)`` and its Config.
The Airflow operator looks stages up here (a test checks that every task of the DAG is listed and
that each module exposes what this says), and `eagle3 <command>` is built from the same entries:
its flags are the Config's fields (``eagle3.config.add_config_arguments``) with the aliases and
choices below, its --help text is ``usage`` (else the module's docstring). Stages that load the
target or a GPU run in a supervised subprocess (``eagle3 <task> --config FILE --result FILE``) so
the task process never initialises CUDA. Nothing is imported until a command is built or run.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping


def _resolve(ref: str) -> Any:
    """``"module:NAME"`` -> that attribute (imported on use: this registry stays import-free)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Stage:
    name: str
    """Task id and subcommand; module ``eagle3.<name>``, function ``<name>(cfg)``."""
    help: str
    """One line for `eagle3 --help`."""
    config: str | None
    """Name of the Config class in the module (None: a command with a parser of its own, ``cli``)."""
    subprocess: bool = False
    """Runs as a supervised child process (it loads the target model or a GPU)."""
    dag: bool = True
    """A task of the DAG (False: a command of the CLI only)."""
    package: str | None = None
    """The module, when it is not ``eagle3.<name>``."""
    usage: str = ""
    """The subcommand's --help description (what it writes, an example); default: the module's docstring."""
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Extra flag names of Config fields, e.g. ``{"model": ("--target",)}``."""
    choices: Mapping[str, str] = field(default_factory=dict)
    """Config field -> ``"module:NAME"`` of the values its flag accepts."""
    skip: tuple[str, ...] = ()
    """Config fields without a flag (set them with --config)."""
    say: str | None = None
    """``"module:function"``: ``function(cfg, summary) -> str``, printed before the JSON summary."""
    cli: str | None = None
    """A module whose ``add_arguments(parser)`` adds flags beyond the Config's and whose ``run(args)`` runs
    the command (train: ``--nproc`` launches torchrun; demo-data has no Config)."""

    @property
    def module(self) -> str:
        return self.package or f"eagle3.{self.name}"

    def config_class(self) -> type:
        return getattr(importlib.import_module(self.module), self.config)

    def function(self):
        return getattr(importlib.import_module(self.module), self.name)

    # -- the subcommand ---------------------------------------------------------------------------
    def description(self) -> str:
        return (self.usage or importlib.import_module(self.module).__doc__ or self.help).strip()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from eagle3.config import add_config_arguments

        if self.config:
            add_config_arguments(parser, self.config_class(), aliases={k: list(v) for k, v in self.aliases.items()},
                                 skip=self.skip, choices={k: tuple(_resolve(v)) for k, v in self.choices.items()})
        if self.cli:
            importlib.import_module(self.cli).add_arguments(parser)

    def run(self, args: argparse.Namespace) -> dict | int:
        """The command: its summary (printed as JSON, written to --result) or an exit code."""
        if self.cli:
            return importlib.import_module(self.cli).run(args)
        from eagle3.config import config_from_args

        cfg = config_from_args(self.config_class(), args)
        summary = self.function()(cfg)
        if self.say:
            print(_resolve(self.say)(cfg, summary))
        return summary


_PRECISION = "eagle3.devices:PRECISIONS"
_STORAGE = "eagle3.storage_options:OPTIONS"

COMMANDS = {s.name: s for s in (  # the order of `eagle3 --help`, which follows the DAG
    Stage("demo-data", "write the bundled demo corpus and its manifest", config=None, dag=False,
          package="eagle3.demo.corpus", cli="eagle3.demo.corpus"),
    Stage("discover", "list a manifest's datasets: what to regenerate, tokenize and extract", "DiscoverConfig"),
    Stage("regenerate", "replace assistant turns with the target's own answers", "RegenerateConfig",
          subprocess=True, skip=("extra_body",),
          choices={"backend": "eagle3.regenerate.config:BACKENDS", "server": "eagle3.regenerate.config:SERVERS",
                   "precision": _PRECISION},
          aliases={"datasets": ("--dataset",), "timeout_s": ("--timeout",),
                   "price_prompt_per_m": ("--price-prompt",), "price_completion_per_m": ("--price-completion",)},
          usage="""Replace the assistant turns of `regenerate: true` datasets with the target's own answers.

Examples:
  eagle3 regenerate --manifest m.yaml --out regen                      # hf backend, SmolLM2 on CPU
  eagle3 regenerate --manifest m.yaml --out regen --backend openai \\
      --base-url http://127.0.0.1:8000/v1 --model default --concurrency 64   # a vLLM or SGLang server
  EAGLE3_OPENAI_API_KEY=sk-... eagle3 regenerate --manifest m.yaml --out regen --backend openai \\
      --base-url https://openrouter.ai/api/v1 --model meta-llama/llama-3.1-8b-instruct \\
      --price-prompt 0.02 --price-completion 0.05

Then tokenize the derived manifest: eagle3 tokenize --manifest regen/manifest.yaml ...
Killed and re-run with the same --out, it resumes (finished conversations are kept)."""),
    Stage("tokenize", "tokenize datasets of a manifest with the chat template and loss masks", "TokenizeConfig",
          aliases={"model": ("--tokenizer",)},
          usage="""Tokenize the datasets of a manifest with the tokenizer's chat template and exact loss masks.

For each dataset (or only --dataset NAME) this writes PREP/<name>/:
  tokenized.parquet  id, input_ids, loss_mask, num_tokens, num_loss_tokens, source
  stats.json         counts, reject reasons, fingerprint
  rejects.jsonl      every refused input line: {"file", "line", "reason", "detail"}
  fingerprint.json   input hash + tokenizer + chat template + settings

The loss mask is 1 on each assistant turn's generated text and its end-of-turn
token, 0 on role headers, system, user and tool turns. A dataset whose
fingerprint is unchanged is skipped (use --force to redo it). The task fails if
more than --max-reject-share of a dataset's records are refused.

example:
  eagle3 tokenize --manifest data/manifest.yaml --tokenizer smollm2-135m-instruct --out prep/"""),
    Stage("stats", "per-dataset token/sample statistics of a prepared folder", "StatsConfig",
          choices={"storage_option": _STORAGE}, say="eagle3.stats:say"),
    Stage("merge", "drop, truncate, dedupe and shuffle prepared datasets into train.parquet", "MergeConfig",
          usage="""Drop, truncate, dedupe and shuffle prepared datasets into one train.parquet.

  eagle3 merge --prepared PREP --out MERGED --max-seq-len 2048 --seed 42 --drop long_reports"""),
    Stage("verify", "re-check a merged dataset and write verify.json (the gate)", "VerifyConfig",
          choices={"storage_option": _STORAGE, "training_mode": "eagle3.verify.mode:MODES"},
          usage="""Re-check a merged dataset and write MERGED/verify.json (the gate); exit 3 when a check fails.

  eagle3 verify --merged MERGED --model smollm2-135m-instruct --storage-option fp8 --store STORE"""),
    Stage("vocab", "build the draft vocab map d2t/t2d from loss-token frequencies", "VocabConfig",
          usage="""Build the draft vocab map d2t/t2d from the loss-token frequencies of a merged dataset.

  eagle3 vocab --merged MERGED --draft-vocab-size 8192 --out VOCAB"""),
    Stage("extract", "run the target and store aux/last hidden states in packed shards", "ExtractConfig",
          subprocess=True, choices={"storage_option": _STORAGE, "precision": _PRECISION,
                                    "engine": "eagle3.extract.config:ENGINES"},
          usage="""Run the target over the merged dataset and store aux-layer / final-norm hidden states.

Writes STORE/<model_fp>-L<a>_<b>_<c>-<storage_option>/ (see docs/extract.md). Samples
already in the store are skipped, so a re-run resumes after a crash and extracts
only new data. Exit code 75 after an out-of-memory: the halved token budget is
saved, and a re-run continues with it.

  eagle3 extract --merged MERGED --model smollm2-135m-instruct --out STORE --shard 0/4

--engine vllm serves the target with vLLM in hidden-state extraction mode instead (the same store; with
--tensor-parallel-size etc. for targets transformers cannot hold; see docs/extract.md). --engine sglang
serves it with SGLang as the target of a capture draft (--storage-option fp8-topk only; untested against a real
SGLang)."""),
    Stage("train", "train the EAGLE-3 draft with training-time test", "TrainConfig", subprocess=True,
          aliases={"model": ("--target",)},
          choices={"init": "eagle3.train.config:INIT_CHOICES", "precision": _PRECISION,
                   "target_engine": "eagle3.extract.config:ENGINES"},
          cli="eagle3.train.launch",
          usage="""Train the EAGLE-3 draft on a hidden-state store (training-time test, TTT).

Resumes from OUT/latest.json when it exists. Exit codes: 0 done, 2 bad input
(never retry), 75 out of memory (state saved with half the micro-batch and
twice the accumulation; re-run the same command to resume).

Online: `eagle3 train --online --merged MERGED --model T [--store STORE] ...` runs the target inside
training (samples the store lacks are computed per micro-batch; --write-back stores them);
`--target-engine vllm` (or `sglang`, with --storage-option fp8-topk) gets them from a server this run starts,
prefetched in the background.

Data-parallel: `eagle3 train --nproc N ...` launches torchrun itself and keeps the exit codes above (torchrun
alone exits 1 whatever its workers' codes); `python -m torch.distributed.run --nproc_per_node N -m
eagle3 train --config CFG.json` works too."""),
    Stage("export", "write the EAGLE3 draft directory SGLang and vLLM load", "ExportConfig",
          choices={"dtype": "eagle3.export:DTYPES"}),
    Stage("evaluate", "speculative decoding benchmark: acceptance length, speed, lossless check", "EvaluateConfig",
          subprocess=True, aliases={"model": ("--target",)}, say="eagle3.evaluate.summary:say",
          choices={"backend": "eagle3.evaluate.config:BACKENDS", "precision": _PRECISION,
                   "proposer": "eagle3.evaluate.lookup:PROPOSERS"},
          usage="""Benchmark a draft with real speculative decoding against its target.

  eagle3 evaluate --target smollm2-135m-instruct --draft DRAFT --prompts humaneval --limit 20 --out EVAL

writes EVAL/report.json (acceptance_length τ, lossless, accept_rate_by_position,
tokens_per_s_spec/base, speedup, per-prompt details). Exit code 3 when any
speculative output differs from the target's greedy output.

--backend vllm serves the target twice with vLLM (baseline, then EAGLE-3 with the
draft) on 127.0.0.1; --backend sglang does the same with SGLang on GPUs.
--compare-with vllm also runs vLLM on the same prompts and sets both engines' τ and
per-position acceptance side by side in report.json (`engines`, `agreement`).
--proposer lookup+draft (project decoder only) puts a prompt lookup in front of the
draft at every chain step; report.json's `proposed_by` counts each proposer's tokens."""),
    Stage("publish", "register an evaluated draft and publish it if it beats the best", "PublishConfig",
          say="eagle3.publish:say"),
    Stage("report", "write a DAG run's report (report.json, plots, report.html, run_summary.json)", "ReportConfig",
          usage="""Write a DAG run's report: RUN/report/{report.json, *.png, report.html, reuse.json} and RUN/run_summary.json.

  eagle3 report --root ARTIFACTS --dag-id eagle3_train --run-id manual__2026-12-01T05:04:34"""),
)}

STAGES = {name: s for name, s in COMMANDS.items() if s.dag}
"""The DAG's stages (every command but the CLI-only ones)."""


def stage(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"no stage {name!r}; stages: {', '.join(STAGES)}") from None
