"""What training reads its samples from: one interface, two implementations.

Offline, a hidden-state store (`eagle3.extract.store.HiddenStateStore`) read through `StoreSource`; online,
`eagle3.train.online.OnlineSource`, which serves what the store holds and runs the target for the rest. The
trainer, its inputs and `data.collate` call the same methods on either, so none of them asks which one it has.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class SampleSource(Protocol):
    mode: str
    """"offline" or "online" (the metrics and the summary record it)."""
    uri: str
    info: dict
    """The store.json-like identity: model_name, model_fingerprint, vocab_size, aux_layers, hidden_size,
    storage_option."""
    aux_layers: list
    hidden_size: int
    storage_option: str

    def __contains__(self, sample_id: str) -> bool: ...

    def sample_ids(self) -> list[str]: ...

    def num_tokens(self, sample_id: str) -> int: ...

    def check(self, sample_ids=None) -> None:
        """Raise InputError when a shard these samples are read from is damaged."""

    def loss_mask(self, sample_id: str):
        """One sample's loss_mask alone (the loss denominators need only this)."""

    def get_many(self, ids: list[str]) -> list[dict]:
        """Per-sample tensors in order: aux, input_ids, loss_mask and last or topk_ids/topk_logprobs."""

    def schedule(self, batches: list[list[str]]) -> None:
        """The micro-batches the trainer asks for next, in order (a source may compute them ahead)."""

    def flush(self) -> None:
        """Publish what the source wrote so far (online write-back) so the next epoch reads it."""

    def close(self) -> None: ...

    def stats(self) -> dict | None:
        """What the source computed so far (online), or None."""

    def engines(self, sample_ids: list[str]) -> dict[str, int]:
        """{engine name: tokens} of what ran the target for these samples (the store's shards, or online the
        source's own engine for the samples it computes)."""


class StoreSource:
    """A hidden-state store as a SampleSource: nothing to compute ahead, write or stop."""

    mode = "offline"

    def __init__(self, store) -> None:
        self.store = store
        self.uri, self.info, self.storage_option = store.uri, store.info, store.storage_option
        self.aux_layers, self.hidden_size = list(store.aux_layers), store.hidden_size

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self.store

    def sample_ids(self) -> list[str]:
        return self.store.sample_ids()

    def num_tokens(self, sample_id: str) -> int:
        return self.store.num_tokens(sample_id)

    def check(self, sample_ids=None) -> None:
        self.store.check(sample_ids)

    def loss_mask(self, sample_id: str):
        return self.store.get_tensor(sample_id, "loss_mask")

    def get_many(self, ids: list[str]) -> list[dict]:
        return [self.store.get(s) for s in ids]

    def schedule(self, batches: list[list[str]]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def stats(self) -> dict | None:
        return None

    def engines(self, sample_ids: list[str]) -> dict[str, int]:
        return self.store.engines(sample_ids)
