"""Both sample sources implement the one interface the trainer calls (eagle3/train/source.py), so the loop never
asks which it has: a store read offline and the online source give the same tensors for the same sample."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from eagle3.extract.store import HiddenStateStore
from eagle3.train.online import OnlineSource
from eagle3.train.source import SampleSource, StoreSource

REPO = Path(__file__).resolve().parents[2]


def test_both_sources_are_sample_sources(tiny_store):
    store = StoreSource(HiddenStateStore(tiny_store["store"]))
    assert isinstance(store, SampleSource) and store.mode == "offline"
    assert OnlineSource.mode == "online"
    missing = [m for m in ("get_many", "loss_mask", "schedule", "flush", "close", "stats", "check", "sample_ids",
                           "num_tokens", "__contains__") if not callable(getattr(OnlineSource, m, None))]
    assert missing == []
    sid = store.sample_ids()[0]
    (whole,) = store.get_many([sid])
    assert torch.equal(store.loss_mask(sid), whole["loss_mask"])  # read alone, the same values
    assert store.stats() is None and sid in store and store.num_tokens(sid) == whole["input_ids"].shape[0]


def test_the_trainer_does_not_ask_which_source_it_has():
    for name in ("loop.py", "data.py", "inputs.py"):
        text = (REPO / "eagle3" / "train" / name).read_text()
        assert not re.search(r"hasattr\((self\.)?(inp\.)?(store|source|inputs\.\w+)", text), name



def test_engines_count_the_tokens_of_the_named_samples_only(tmp_path):
    from eagle3.extract.codec import encode
    from eagle3.extract.store import StoreWriter

    lengths = {"transformers": [5, 7, 3], "vllm": [4, 6]}
    for task, (engine, ns) in enumerate(lengths.items()):  # two tasks of the same store, one engine each
        w = StoreWriter(str(tmp_path / "store"), model_fp="fp", model_name="m", aux_layers=[0, 1, 2], hidden_size=4,
                        vocab_size=10, storage_option="bf16", task=f"{task}of2", engine={"name": engine}).open()
        w.write_shard([{"id": f"{engine}{i}", "input_ids": torch.arange(n, dtype=torch.int32),
                        "loss_mask": torch.ones(n, dtype=torch.uint8),
                        "tensors": encode("bf16", torch.randn(n, 12), torch.randn(n, 4))} for i, n in enumerate(ns)])
    store = HiddenStateStore(str(tmp_path / "store"))
    assert store.engines() == {"transformers": 15, "vllm": 10}
    assert StoreSource(store).engines(["transformers1", "vllm0", "vllm1"]) == {"transformers": 7, "vllm": 10}
    assert store.engines([]) == {}
