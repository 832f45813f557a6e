"""The train stage: the EAGLE-3 draft trained with training-time test on a hidden-state store.

Modules: ``config`` (TrainConfig, the schedule), ``inputs`` (store, vocab map, target head),
``data`` (deterministic batches), ``objective`` (TTT loss), ``loop`` (the Trainer),
``distributed`` (torchrun ranks), ``oom`` (how a run adapts after an out-of-memory), ``launch`` (`eagle3 train`).
Checkpoints are :mod:`eagle3.checkpoint`. Nothing heavy is imported here.
"""

from eagle3.train.config import TrainConfig


def train(cfg: TrainConfig) -> dict:
    """Train (or resume) the draft; returns the summary (checkpoint, steps, held-out acc, adapted batch).

    Raises InputError for bad input (never retried) and GpuOutOfMemory after an OOM whose adapted state
    is saved (retry to resume).
    """
    from eagle3.train.loop import train as run

    return run(cfg)


__all__ = ["TrainConfig", "train"]
