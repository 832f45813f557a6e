"""VocabConfig: the draft vocabulary's size and where the map goes (numpy-free)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.errors import InputError


@dataclass(frozen=True)
class VocabConfig:
    merged: str
    """Merged folder written by `eagle3 merge` (local or s3://)."""
    out: str
    """Vocab folder to write (VOCAB); local or s3://."""
    draft_vocab_size: int = 8192
    """Vd: tokens in the draft's lm_head (32000 suits large targets)."""
    vocab_size: int | None = None
    """V: the target's vocab size; default: `vocab_size` of the merged manifest."""
    force: bool = False
    """Rebuild even when VOCAB/ already holds a map with the same cache key."""

    def __post_init__(self):
        if self.draft_vocab_size < 1:
            raise InputError(f"draft_vocab_size must be >= 1, got {self.draft_vocab_size!r} (e.g. 8192)")
        if self.vocab_size is not None and self.vocab_size < self.draft_vocab_size:
            raise InputError(f"vocab_size {self.vocab_size} is smaller than draft_vocab_size "
                             f"{self.draft_vocab_size}; the draft vocab is a subset of the target's")
