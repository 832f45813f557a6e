"""The discover stage: what a DAG run fans out over, from the manifest.

Validates the manifest (every source must exist) and returns the mapped tasks' arguments:
the datasets to regenerate, the datasets to tokenize (a regenerated one reads the
regenerated file instead of its source) and the extraction shards.

It also checks, in seconds, the run's settings that later stages would refuse only after hours of regeneration,
extraction and training (``preflight``): the drop list against the manifest, the evaluate settings and prompt
sets, the training settings, and the aux layers against the target's depth.

  eagle3 discover --manifest M.yaml --root ARTIFACTS --extract-shards 4
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3 import layout
from eagle3.errors import InputError

PREFLIGHT_KEYS = ("drop", "evaluate", "train", "model", "aux_layers")


@dataclass(frozen=True)
class DiscoverConfig:
    manifest: str
    """Datasets manifest (YAML with a top-level ``datasets:`` list; local or s3://)."""
    root: str
    """Storage root (eagle3.layout): where regenerated datasets are written."""
    extract_shards: int = 1
    """Mapped extraction tasks (pool gpu caps how many run at once)."""
    regenerate_tasks: int = 0
    """Mapped regeneration tasks the datasets to regenerate are dealt over, in manifest order; 0: one per
    dataset. Each task serves the target once for all of its datasets, so fewer tasks start fewer servers."""
    preflight: dict[str, Any] = field(default_factory=dict)
    """The run's settings to check before any work: ``drop`` (dataset names), ``evaluate`` and ``train`` (their
    Configs' fields known at trigger time; the folders are filled in), ``model`` and ``aux_layers``."""

    def __post_init__(self):
        for name, low in (("extract_shards", 1), ("regenerate_tasks", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 1024:
                raise InputError(f"DiscoverConfig.{name}={value!r} must be an integer in [{low}, 1024] "
                                 "(Airflow's max_map_length)")


def discover(cfg: DiscoverConfig) -> dict:
    """The mapped tasks' Config fields: {"regenerate": [{"datasets": [names]}], "tokenize": [{"dataset",
    "source_override"}], "extract": [{"shard": "i/n"}]}."""
    from eagle3.datasets.manifest import load_manifest

    specs = load_manifest(cfg.manifest)
    preflight(cfg.preflight, [ds.name for ds in specs])
    to_regenerate, tokenize = [], []
    for ds in specs:
        override = layout.regenerated_source(cfg.root, ds.name) if ds.regenerate else None
        if ds.regenerate:
            to_regenerate.append(ds.name)
        tokenize.append({"dataset": ds.name, "source_override": override})
    groups = min(cfg.regenerate_tasks or len(to_regenerate), len(to_regenerate))
    regenerate = [{"datasets": to_regenerate[i::groups]} for i in range(groups)]
    shards = [{"shard": f"{i}/{cfg.extract_shards}"} for i in range(cfg.extract_shards)]
    return {"regenerate": regenerate, "tokenize": tokenize, "extract": shards}


def preflight(settings: dict[str, Any], datasets: list[str]) -> None:
    """An InputError for the first setting of ``settings`` (DiscoverConfig.preflight) that a later stage of the
    run would refuse; ``datasets`` are the manifest's names."""
    from eagle3.config import from_dict

    unknown = sorted(set(settings) - set(PREFLIGHT_KEYS))
    if unknown:
        raise InputError(f"DiscoverConfig.preflight: unknown key(s) {unknown}; known: {', '.join(PREFLIGHT_KEYS)}")
    missing = sorted(set(settings.get("drop") or ()) - set(datasets))
    if missing:
        raise InputError(f"drop names dataset(s) {missing} that the manifest does not have (it has: "
                         f"{', '.join(datasets)}); merge would refuse them after regeneration and tokenization")
    if settings.get("evaluate"):
        from eagle3.evaluate.config import EvaluateConfig
        from eagle3.evaluate.prompts import load_prompt_sets

        ev = from_dict(EvaluateConfig, {"model": settings.get("model") or "-", "draft": "-", "out": "-",
                                        **settings["evaluate"]}, "evaluate")
        load_prompt_sets(ev.prompts, 1)  # each set exists and parses
    if settings.get("train"):
        from eagle3.train.config import TrainConfig

        from_dict(TrainConfig, {"store": "-", "vocab": "-", "out": "-", **settings["train"]}, "train")
    if settings.get("aux_layers") and settings.get("model"):
        from eagle3.target import config_int, read_config, resolve_aux_layers

        model = settings["model"]
        resolve_aux_layers(list(settings["aux_layers"]),
                           config_int(read_config(model), "num_hidden_layers", model), model)
