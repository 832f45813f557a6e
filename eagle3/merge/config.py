"""MergeConfig: every setting of the merge stage (torch- and numpy-free)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.config import DEFAULT_MAX_SEQ_LEN, DEFAULT_SEED
from eagle3.errors import InputError


def _names(value) -> tuple[str, ...]:
    """Accept "a,b", ["a", "b"] or None (Airflow Params may give either)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    return tuple(v.strip() for v in value if v and v.strip())


@dataclass(frozen=True)
class MergeConfig:
    prepared: str
    """Prepared folder (PREP) holding <dataset>/tokenized.parquet (+ stats.json); local or s3://."""
    out: str
    """Merged folder to write (MERGED); local or s3://."""
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    """Every sample is cut to this many tokens; its loss_mask is cut with it."""
    seed: int = DEFAULT_SEED
    """Seed of the shuffle."""
    drop: tuple[str, ...] = ()
    """Dataset names left out of the merge (recorded in manifest.json)."""
    datasets: tuple[str, ...] = ()
    """Only merge these datasets (empty: every dataset in the prepared folder, or the manifest's)."""
    manifest: str | None = None
    """Dataset manifest: merge only its datasets (the prepared folder is shared between runs) and drop
    those it marks ``drop: true`` as well as the drop list."""
    export_jsonl: bool = False
    """Also write train.jsonl in the seed format."""
    vocab_size: int | None = None
    """Target vocab size recorded for the vocab stage; default: taken from stats.json when present."""
    batch_rows: int = 1024
    """Rows per streamed record batch."""
    bucket_mb: float = 32
    """Size of one shuffle bucket held in memory at a time; bounds the peak memory."""

    def __post_init__(self):
        object.__setattr__(self, "drop", _names(self.drop))
        object.__setattr__(self, "datasets", _names(self.datasets))
        if int(self.max_seq_len) < 1:
            raise InputError(f"max_seq_len must be >= 1, got {self.max_seq_len!r} (e.g. --max-seq-len 8192)")
        if self.batch_rows < 1 or self.bucket_mb <= 0:
            raise InputError(f"batch_rows must be >= 1 and bucket_mb > 0, got {self.batch_rows}, {self.bucket_mb}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise InputError(f"vocab_size must be >= 1, got {self.vocab_size!r}")

    def resolved(self) -> "MergeConfig":
        """The datasets and drop list with the manifest's applied (reads the manifest, not its sources)."""
        if not self.manifest:
            return self
        import dataclasses

        from eagle3.datasets.manifest import load_manifest

        specs = load_manifest(self.manifest, check_sources=False)
        return dataclasses.replace(self, datasets=self.datasets or tuple(d.name for d in specs),
                                   drop=tuple(sorted(set(self.drop) | {d.name for d in specs if d.drop})))
