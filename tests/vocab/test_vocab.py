"""Vocab map: loss-position frequencies, d2t/t2d layout, fill rule, cache key with Vd."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eagle3.cli import main as cli_main
from eagle3.errors import InputError
from eagle3.merge import MergeConfig, merge
from eagle3.vocab import VocabConfig, vocab, load_vocab
from tests.merge.prepared_factory import write_prepared

V = 64


def merged_from(tmp_path, rows, seed=42, name="m") -> str:
    prep = write_prepared(tmp_path / f"prep-{name}", {"a": rows}, vocab_size=V)
    out = str(tmp_path / name)
    merge(MergeConfig(prepared=prep, out=out, seed=seed))
    return out


@pytest.fixture
def counted(tmp_path) -> str:
    """Loss-position counts: 10 -> 5, 40 -> 4, 3 -> 3, 50 -> 2, 7 -> 1. Token 60 appears 20
    times but never at a loss position, so it must not win over any loss token."""
    rows = [
        ([60] * 10 + [10] * 5 + [40] * 4, [0] * 10 + [1] * 9),
        ([60] * 10 + [3, 3, 3, 50, 50, 7], [0] * 10 + [1] * 6),
        ([10, 40, 1], [0, 0, 1]),  # 1 -> 1 at a loss position; 10 and 40 also at other positions
    ]
    return merged_from(tmp_path, rows)


def test_top_tokens_by_loss_frequency_sorted_by_id(tmp_path, counted):
    info = vocab(VocabConfig(merged=counted, out=str(tmp_path / "v"), draft_vocab_size=3, vocab_size=V))
    d2t, t2d = load_vocab(str(tmp_path / "v"))
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_ and d2t.shape == (3,) and t2d.shape == (V,)
    hot = d2t + np.arange(3)  # what SGLang computes: target_id = i + d2t[i]
    assert hot.tolist() == [3, 10, 40]
    assert np.flatnonzero(t2d).tolist() == [3, 10, 40]
    assert info["distinct_tokens"] == 6 and info["loss_tokens"] == 16
    assert info["coverage"] == pytest.approx(12 / 16)
    assert info["fill"] == {"from_loss_tokens": 3, "from_other_positions": 0, "from_lowest_unused_ids": 0}


def test_fewer_distinct_tokens_than_vd_are_filled_and_recorded(tmp_path, counted):
    info = vocab(VocabConfig(merged=counted, out=str(tmp_path / "v"), draft_vocab_size=10, vocab_size=V))
    d2t, t2d = load_vocab(str(tmp_path / "v"))
    hot = (d2t + np.arange(10)).tolist()
    # 6 loss tokens, then 60 (seen at other positions), then the lowest unused ids 0, 2, 4.
    assert hot == sorted([1, 3, 7, 10, 40, 50, 60, 0, 2, 4])
    assert t2d.sum() == 10 and len(set(hot)) == 10
    assert info["fill"] == {"from_loss_tokens": 6, "from_other_positions": 1, "from_lowest_unused_ids": 3}
    assert info["coverage"] == 1.0


def test_cache_key_includes_vd_and_the_data(tmp_path, counted):
    out = str(tmp_path / "v")
    first = vocab(VocabConfig(merged=counted, out=out, draft_vocab_size=3, vocab_size=V))
    again = vocab(VocabConfig(merged=counted, out=out, draft_vocab_size=3, vocab_size=V))
    assert again["reused"] is True and again["cache_key"] == first["cache_key"]
    # Known bug of other trainers: a cache keyed without Vd returns the old map here.
    bigger = vocab(VocabConfig(merged=counted, out=out, draft_vocab_size=5, vocab_size=V))
    assert bigger["reused"] is False and bigger["cache_key"] != first["cache_key"]
    assert load_vocab(out)[0].shape == (5,)
    other = merged_from(tmp_path, [([1, 2, 3], [1, 1, 1])], name="m2")
    rebuilt = vocab(VocabConfig(merged=other, out=out, draft_vocab_size=5, vocab_size=V))
    assert rebuilt["reused"] is False and (load_vocab(out)[0] + np.arange(5)).tolist() == [0, 1, 2, 3, 4]


def test_vocab_size_from_manifest_and_errors(tmp_path, counted):
    info = vocab(VocabConfig(merged=counted, out=str(tmp_path / "v"), draft_vocab_size=4))
    assert info["vocab_size"] == V  # recorded by merge from stats.json
    with pytest.raises(InputError, match="token id 60 is outside the target vocab of size 50"):
        vocab(VocabConfig(merged=counted, out=str(tmp_path / "v2"), draft_vocab_size=4, vocab_size=50))
    with pytest.raises(InputError, match="smaller than draft_vocab_size"):
        VocabConfig(merged=counted, out="x", draft_vocab_size=100, vocab_size=50)
    with pytest.raises(InputError, match="manifest.json not found"):
        vocab(VocabConfig(merged=str(tmp_path / "nowhere"), out="x", draft_vocab_size=4))


def test_cli_vocab(tmp_path, counted, capsys):
    rc = cli_main(["vocab", "--merged", counted, "--draft-vocab-size", "2", "--out", str(tmp_path / "v")])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["draft_vocab_size"] == 2
    info = json.loads((tmp_path / "v" / "vocab.json").read_text())
    assert info["cache_key_inputs"]["draft_vocab_size"] == 2 and info["cache_key_inputs"]["content_hash"]
    assert (load_vocab(str(tmp_path / "v"))[0] + np.arange(2)).tolist() == [10, 40]


def test_a_changed_map_is_refused_naming_both_digests(tmp_path, counted):
    """load_vocab checks vocab.safetensors against vocab.json's sha256 (eagle3.storage.sha256_problem)."""
    import hashlib

    out = tmp_path / "v"
    vocab(VocabConfig(merged=counted, out=str(out), draft_vocab_size=3, vocab_size=V))
    want = json.loads((out / "vocab.json").read_text())["checksums"]["vocab.safetensors"]
    data = bytearray((out / "vocab.safetensors").read_bytes())
    data[-1] ^= 1
    (out / "vocab.safetensors").write_bytes(bytes(data))
    with pytest.raises(InputError) as info:
        load_vocab(str(out))
    got = hashlib.sha256(bytes(data)).hexdigest()
    assert str(info.value) == (f"{out / 'vocab.safetensors'}: sha256 {got} differs from vocab.json's {want}: the file "
                               "changed after it was written; rebuild it with `eagle3 vocab --force`")
