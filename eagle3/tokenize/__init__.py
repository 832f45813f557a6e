"""The tokenize stage: read datasets, apply the tokenizer's chat template, write exact loss masks.

Submodules: ``chat_mask`` (template probe and assistant-span masks), ``stage`` (the work
and its outputs); ``eagle3 tokenize`` is wired in eagle3.stages. The manifest and the dataset
files are read by ``eagle3.datasets``, the one reader every stage shares. Nothing heavy is
imported here.
"""

from eagle3.tokenize.config import TokenizeConfig


def tokenize(cfg: TokenizeConfig) -> dict:
    """Write PREP/<dataset>/ for each dataset (reused when its fingerprint is unchanged);
    returns ``{"datasets": {name: summary}}``."""
    from eagle3.tokenize.stage import run

    return run(cfg)


__all__ = ["TokenizeConfig", "tokenize"]
