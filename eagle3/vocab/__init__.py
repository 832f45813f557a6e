"""The vocab stage: d2t/t2d, the draft's Vd most frequent loss tokens and their target ids; VOCAB/.

``vocab(VocabConfig) -> vocab.json content``; the work is in :mod:`eagle3.vocab.stage`.
"""

from eagle3.vocab.config import VocabConfig


def vocab(cfg: VocabConfig) -> dict:
    """Write VOCAB/vocab.safetensors (d2t int64 [Vd], t2d bool [V]) and vocab.json, or reuse them when the
    cache key (tokenizer, data hash, Vd, V) is unchanged."""
    from eagle3.vocab.stage import run

    return run(cfg)


def load_vocab(uri: str):
    """(d2t, t2d) numpy arrays of a vocab folder."""
    from eagle3.vocab.stage import load_vocab as load

    return load(uri)


__all__ = ["VocabConfig", "load_vocab", "vocab"]
