"""Regenerate assistant turns with the target (the stage before tokenize for ``regenerate: true`` datasets).

    from eagle3.regenerate import RegenerateConfig, regenerate
    summary = regenerate(RegenerateConfig(manifest="m.yaml", out="regen", backend="hf"))
    summary["manifest"]  # the manifest to tokenize: regenerated sources swapped in

This package's ``__init__`` stays light (no torch, no httpx) so the CLI's --help is fast.
"""

from eagle3.regenerate.stage import RegenerateConfig, TooManyErrors, regenerate

__all__ = ["RegenerateConfig", "TooManyErrors", "regenerate"]
