"""The tokenize stage: read datasets, apply the tokenizer's chat template, write exact loss masks.

Submodules: ``manifest`` (the datasets YAML), ``readers`` (files to records),
``records`` (the checks of one record and the reject reasons), ``describe`` (untrusted
values in messages), ``chat_mask`` (template probe and assistant-span masks),
``stage`` (the work and its outputs), ``cli`` (``eagle3 tokenize``).
Nothing heavy is imported here.
"""

from eagle3.tokenize.config import TokenizeConfig
from eagle3.tokenize.manifest import DatasetSpec, load_manifest


def tokenize(cfg: TokenizeConfig) -> dict:
    """Write PREP/<dataset>/ for each dataset (reused when its fingerprint is unchanged);
    returns ``{"datasets": {name: summary}}``."""
    from eagle3.tokenize.stage import run

    return run(cfg)


__all__ = ["DatasetSpec", "TokenizeConfig", "load_manifest", "tokenize"]
