"""TokenizeConfig: every setting of the tokenize stage (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.errors import InputError


@dataclass(frozen=True)
class TokenizeConfig:
    manifest: str
    """Datasets manifest: YAML with a top-level ``datasets:`` list (local or s3://)."""
    model: str
    """The target whose tokenizer and chat template are used: model directory, s3:// prefix, or the alias
    smollm2-135m-instruct."""
    out: str
    """The prepared folder PREP: one <dataset>/ folder each (local or s3://)."""
    dataset: str | None = None
    """Tokenize only this dataset of the manifest (the DAG maps one task per dataset)."""
    source_override: str | None = None
    """With ``dataset``: read this file (format messages, as `eagle3 regenerate` writes it) instead of the
    manifest's source."""
    max_reject_share: float = 0.05
    """Fail a dataset when more than this share of its records is refused."""
    batch_size: int = 1024
    """Conversations rendered and encoded per encode_batch call."""
    force: bool = False
    """Tokenize again even when the fingerprint is unchanged."""

    def __post_init__(self):
        if self.source_override and not self.dataset:
            raise InputError("TokenizeConfig.source_override needs TokenizeConfig.dataset (the dataset it replaces)")
        if not 0.0 <= self.max_reject_share <= 1.0:
            raise InputError(f"max_reject_share {self.max_reject_share!r} must be between 0 and 1, e.g. 0.05")
        if self.batch_size < 1:
            raise InputError(f"batch_size {self.batch_size!r} must be positive")
