"""The extract stage: target hidden states into a packed safetensors store.

Modules: ``store`` (writer + memory-mapped reader, the trainer's entry point),
``codec`` (storage options bf16 / fp8 / fp8-topk and ``target_logprobs``),
``capture`` (the target forward pass), ``plan`` (deterministic task split,
shards and batches), ``stage`` (``extract(ExtractConfig) -> dict``), ``cli``.
Kept import-light: nothing heavy is imported here.
"""
