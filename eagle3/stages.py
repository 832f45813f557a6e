"""The DAG's stages: one task id = one module ``eagle3.<task>`` exposing ``<task>(cfg)`` and its Config.

The Airflow operator looks stages up here; a test checks that every task of the DAG is listed and
that each module exposes what this says. Stages that load the target or a GPU run in a supervised
subprocess (``eagle3 <task> --config FILE --result FILE``) so the task process never initialises CUDA.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    """Task id, module ``eagle3.<name>``, function ``<name>(cfg)``."""
    config: str
    """Name of the Config class in that module."""
    subprocess: bool
    """Runs as a supervised child process (it loads the target model or a GPU)."""

    @property
    def module(self) -> str:
        return f"eagle3.{self.name}"

    def config_class(self) -> type:
        return getattr(importlib.import_module(self.module), self.config)

    def function(self):
        return getattr(importlib.import_module(self.module), self.name)


STAGES = {s.name: s for s in (
    Stage("discover", "DiscoverConfig", subprocess=False),
    Stage("regenerate", "RegenerateConfig", subprocess=True),
    Stage("tokenize", "TokenizeConfig", subprocess=False),
    Stage("stats", "StatsConfig", subprocess=False),
    Stage("merge", "MergeConfig", subprocess=False),
    Stage("verify", "VerifyConfig", subprocess=False),
    Stage("vocab", "VocabConfig", subprocess=False),
    Stage("extract", "ExtractConfig", subprocess=True),
    Stage("train", "TrainConfig", subprocess=True),
    Stage("export", "ExportConfig", subprocess=False),
    Stage("evaluate", "EvaluateConfig", subprocess=True),
    Stage("publish", "PublishConfig", subprocess=False),
    Stage("report", "ReportConfig", subprocess=False),
)}


def stage(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"no stage {name!r}; stages: {', '.join(STAGES)}") from None
