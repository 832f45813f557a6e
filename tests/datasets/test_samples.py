"""The sample content id (eagle3.datasets.samples): one definition, checked against an oracle."""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from eagle3.datasets.samples import content_id, tokenized_schema
from eagle3.merge.arrays import output_schema


def test_content_id_is_sha256_of_little_endian_int32_ids_then_uint8_mask():
    ids, mask = [1, 70000, 2**31 - 1], [0, 1, 1]
    oracle = hashlib.sha256(struct.pack("<3i", *ids) + bytes(mask)).hexdigest()[:32]
    assert content_id(np.array(ids, dtype=np.int64), np.array(mask, dtype=np.int64)) == oracle
    assert content_id(np.array(ids, dtype=">i4"), np.array(mask, dtype=bool)) == oracle  # any input dtype
    assert content_id(np.array(ids), np.array([1, 1, 1])) != oracle  # the mask is part of the id


def test_merge_writes_the_tokenized_columns_plus_source_id():
    assert output_schema().names == [*tokenized_schema().names, "source_id"]
    assert tokenized_schema().names == ["id", "input_ids", "loss_mask", "num_tokens", "num_loss_tokens", "source"]
