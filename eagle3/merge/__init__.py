"""The merge stage: drop, truncate, dedupe and shuffle prepared datasets into MERGED/train.parquet.

``merge(MergeConfig) -> summary``; the work is in :mod:`eagle3.merge.stage`, the Arrow/numpy
helpers it shares with verify and vocab in :mod:`eagle3.merge.arrays`.
"""

from eagle3.merge.config import MergeConfig


def merge(cfg: MergeConfig) -> dict:
    """Write MERGED/train.parquet and manifest.json; returns the manifest's totals and content hash."""
    from eagle3.merge.stage import run

    return run(cfg)


__all__ = ["MergeConfig", "merge"]
