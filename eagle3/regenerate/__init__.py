"""The regenerate stage: the assistant turns of ``regenerate: true`` datasets, answered again by the target.

    from eagle3.regenerate import RegenerateConfig, regenerate
    summary = regenerate(RegenerateConfig(manifest="m.yaml", out="regen", backend="hf"))
    summary["manifest"]  # the manifest to tokenize: regenerated sources swapped in

This package's ``__init__`` stays light (no torch, no httpx) so the CLI's --help is fast.
"""

from eagle3.regenerate.config import RegenerateConfig, TooManyErrors


def regenerate(cfg: RegenerateConfig, api_key: str | None = None) -> dict:
    """Regenerate the selected datasets; returns ``{"manifest": derived manifest URI, "datasets": {name: stats},
    "incomplete": {name: why}}`` (``regenerate: true`` datasets the derived manifest keeps on their source).

    ``api_key`` (openai) overrides the environment variable named by ``cfg.api_key_env``.
    It is never logged or written.
    """
    from eagle3.regenerate.stage import run

    return run(cfg, api_key)


__all__ = ["RegenerateConfig", "TooManyErrors", "regenerate"]
