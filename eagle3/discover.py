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

    def __post_init__(self):
        if not isinstance(self.extract_shards, int) or not 1 <= self.extract_shards <= 1024:
            raise InputError(f"extract_shards={self.extract_shards!r} must be an integer in [1, 1024] "
                             "(Airflow's max_map_length)")


def discover(cfg: DiscoverConfig) -> dict:
    """The mapped tasks' Config fields: {"regenerate": [{"datasets": [name]}], "tokenize": [{"dataset",
    "source_override"}], "extract": [{"shard": "i/n"}]}."""
    from eagle3.datasets.manifest import load_manifest

    regenerate, tokenize = [], []
    for ds in load_manifest(cfg.manifest):
        override = layout.regenerated_source(cfg.root, ds.name) if ds.regenerate else None
        if ds.regenerate:
            regenerate.append({"datasets": [ds.name]})
        tokenize.append({"dataset": ds.name, "source_override": override})
    shards = [{"shard": f"{i}/{cfg.extract_shards}"} for i in range(cfg.extract_shards)]
    return {"regenerate": regenerate, "tokenize": tokenize, "extract": shards}

