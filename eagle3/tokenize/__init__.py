"""Tokenize stage: read datasets, apply the tokenizer's chat template, write exact loss masks.

Submodules: ``manifest`` (the datasets YAML), ``readers`` (files to records),
``records`` (the checks of one record and the reject reasons), ``describe`` (untrusted
values in messages), ``chat_mask`` (template probe and assistant-span masks),
``stage`` (the stage function and its outputs), ``cli`` (``eagle3 tokenize``).
Nothing heavy is imported here.
"""

from eagle3.tokenize.manifest import DatasetSpec, load_manifest

__all__ = ["DatasetSpec", "load_manifest"]
