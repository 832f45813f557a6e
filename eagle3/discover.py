"""The discover stage: what a DAG run fans out over, from the manifest.

Validates the manifest (every source must exist) and returns the mapped tasks' arguments:
the datasets to regenerate, the datasets to tokenize (a regenerated one reads the
regenerated file instead of its source) and the extraction shards.

  eagle3 discover --manifest M.yaml --root ARTIFACTS --extract-shards 4
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3 import layout
from eagle3.errors import InputError


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

    to_regenerate, tokenize = [], []
    for ds in load_manifest(cfg.manifest):
        override = layout.regenerated_source(cfg.root, ds.name) if ds.regenerate else None
        if ds.regenerate:
            to_regenerate.append(ds.name)
        tokenize.append({"dataset": ds.name, "source_override": override})
    groups = min(cfg.regenerate_tasks or len(to_regenerate), len(to_regenerate))
    regenerate = [{"datasets": to_regenerate[i::groups]} for i in range(groups)]
    shards = [{"shard": f"{i}/{cfg.extract_shards}"} for i in range(cfg.extract_shards)]
    return {"regenerate": regenerate, "tokenize": tokenize, "extract": shards}

