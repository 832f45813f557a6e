"""eagle3.storage_options is the one owner of bytes per token: the codec writes exactly its tensors, and the
verify gate's and the stats stage's estimates equal the bytes extraction writes, for every option."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from eagle3 import storage_options
from eagle3.extract import ExtractConfig, extract
from eagle3.merge import MergeConfig, merge
from eagle3.verify import VerifyConfig, verify
from tests.merge.prepared_factory import random_rows, write_prepared


def tensor_bytes(path) -> dict[str, tuple[str, list[int], int]]:
    """{name: (dtype, shape, data bytes)} from a safetensors header (read by hand, not by the writer)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], v["data_offsets"][1] - v["data_offsets"][0]) for k, v in header.items()}


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bytes")
    rng = np.random.default_rng(3)
    prep = write_prepared(tmp / "prep", {"a": random_rows(rng, 12, vocab=49152), "b": random_rows(rng, 9, vocab=49152)},
                          vocab_size=49152)
    merge(MergeConfig(prepared=prep, out=str(tmp / "merged"), max_seq_len=32, seed=1))
    return str(tmp / "merged")


@pytest.mark.parametrize("option", list(storage_options.OPTIONS))
def test_gate_estimate_equals_the_bytes_extraction_writes(option, merged, tiny_llama_dir, tmp_path):
    gate = verify(VerifyConfig(merged, model=tiny_llama_dir, storage_option=option, store=str(tmp_path)))
    estimate = next(c for c in gate["checks"] if c["name"] == "extraction_space")
    summary = extract(ExtractConfig(merged=merged, model=tiny_llama_dir, out=str(tmp_path / "store"),
                                    storage_option=option, device="cpu", shard_mb=64, progress_every_s=0))
    shards = sorted((tmp_path / "store").glob("*/shard-*.safetensors"))
    assert len(shards) == 1 and summary["samples_extracted"] == gate["samples"]
    written = tensor_bytes(shards[0])
    assert estimate["bytes"] == sum(b for _, _, b in written.values())
    # The tensors are the option's, with the widths it states (H = 64 for the tiny model).
    option_tensors = {t.name: t for t in storage_options.option(option).tensors}
    assert set(written) == set(option_tensors) | {"input_ids", "loss_mask", "offsets"}
    for name, t in option_tensors.items():
        assert written[name][1] == [gate["tokens"], t.columns(64)], name
    # The stats stage prices a token the same way.
    assert estimate["bytes_per_token"] == storage_options.bytes_per_token(option, 64)


def test_hand_computed_bytes_per_token():
    """DESIGN: bf16 stores 8H bytes (+5 for id and mask); fp8 4H+8; fp8-topk 3H+6+6K, K=16."""
    h = 7168
    assert storage_options.bytes_per_token("bf16", h) == 8 * h + 5 == 57349
    assert storage_options.bytes_per_token("fp8", h) == 4 * h + 8 + 5
    assert storage_options.bytes_per_token("fp8-topk", h) == 3 * h + 102 + 5
    assert storage_options.store_bytes("bf16", 576, tokens=10, samples=2, shards=3) == 10 * (8 * 576 + 5) + 8 * 5
