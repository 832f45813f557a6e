"""The extract stage: the target's hidden states into a packed safetensors store.

Modules: ``config`` (ExtractConfig), ``stage`` (the work), ``store`` (writer + memory-mapped
reader, the trainer's entry point), ``codec`` (the storage options' tensors and
``target_logprobs``), ``capture`` (the target forward pass), ``lean_llama`` (the lean CPU
forward), ``plan`` (deterministic task split, shards and batches). Its CLI is eagle3.stages.
Kept import-light: nothing heavy is imported here.
"""

from eagle3.extract.config import ExtractConfig


def extract(cfg: ExtractConfig) -> dict:
    """Run one extraction task (its I/N share of the merged samples not yet stored); returns its summary."""
    from eagle3.extract.stage import run

    return run(cfg)


__all__ = ["ExtractConfig", "extract"]
