"""Verify gate: passes on a real merge, and each check fails on its own planted defect."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3 import storage
from eagle3.cli import main as cli_main
from eagle3.errors import GateFailed
from eagle3.merge import MergeConfig, merge
from eagle3.merge.arrays import content_id
from eagle3.verify import VerifyConfig, verify
from eagle3.verify import stage
from eagle3.verify.stage import ks_uniform
from tests.merge.prepared_factory import random_rows, write_prepared

L = 24


@pytest.fixture
def merged(tmp_path) -> str:
    rng = np.random.default_rng(11)
    data = {"a": random_rows(rng, 60), "b": random_rows(rng, 40), "c": random_rows(rng, 30)}
    data["a"].append(data["a"][0])  # a duplicate
    data["b"].append((list(range(40)), [0] * 30 + [1] * 10))  # no loss left after truncation
    prep = write_prepared(tmp_path / "prep", data)
    out = str(tmp_path / "merged")
    merge(MergeConfig(prepared=prep, out=out, max_seq_len=L, seed=5))
    return out


def plant(merged: str, edit, fix_checksum: bool = True, row_group_size: int | None = None) -> None:
    """Rewrite train.parquet through edit(dict of columns) -> dict, keeping the manifest checksum
    in step unless told otherwise, so only the targeted check can notice."""
    path = os.path.join(merged, "train.parquet")
    table = pq.read_table(path)
    cols = edit(table.to_pydict())
    pq.write_table(pa.table(cols, schema=table.schema), path, row_group_size=row_group_size)
    if fix_checksum:
        man = storage.read_json(os.path.join(merged, "manifest.json"))
        man["checksums"]["train.parquet"] = storage.sha256_file(path)
        storage.write_json(os.path.join(merged, "manifest.json"), man)


def failed_checks(merged: str, **options) -> tuple[set, str, dict]:
    with pytest.raises(GateFailed) as err:
        verify(VerifyConfig(merged, **options))
    result = json.loads(open(os.path.join(merged, "verify.json")).read())
    assert result["passed"] is False
    return set(result["failed"]), str(err.value), {c["name"]: c for c in result["checks"]}


def test_a_correct_merge_passes_every_check(merged):
    result = verify(VerifyConfig(merged))
    assert result["passed"] is True
    names = [c["name"] for c in result["checks"]]
    assert names == ["checksums", "lengths", "masks", "ids", "accounting", "matches_source", "shuffled",
                     "uniform_positions", "reproducible", "extraction_space", "memory", "expectations", "totals",
                     "dropped_datasets"]
    assert all(c["passed"] for c in result["checks"])
    acc = {c["name"]: c for c in result["checks"]}["accounting"]["sources"]
    assert acc["b"]["samples_in"] == 41 and acc["b"]["imbalance"] == {
        "samples": 0, "tokens": 0, "loss_tokens": 0, "drops_listed": 0}
    assert json.loads(open(os.path.join(merged, "verify.json")).read())["passed"] is True


def test_a_missing_row_breaks_the_accounting(merged):
    plant(merged, lambda c: {k: v[1:] for k, v in c.items()})
    failed, msg, checks = failed_checks(merged)
    assert "accounting" in failed and "checksums" not in failed
    assert "samples off by 1" in msg


def test_a_changed_file_breaks_the_checksum(merged):
    plant(merged, lambda c: c, fix_checksum=False)  # same rows, rewritten bytes are identical...
    man = storage.read_json(os.path.join(merged, "manifest.json"))
    man["checksums"]["train.parquet"] = "0" * 64  # ...so plant the mismatch in the manifest instead
    storage.write_json(os.path.join(merged, "manifest.json"), man)
    failed, msg, _ = failed_checks(merged)
    assert failed == {"checksums"} and "changed since merge: ['train.parquet']" in msg


def _edit_row(c, r, ids=None, mask=None, fix_id=True):
    ids = c["input_ids"][r] if ids is None else ids
    mask = c["loss_mask"][r] if mask is None else mask
    c["input_ids"][r], c["loss_mask"][r] = ids, mask
    c["num_tokens"][r], c["num_loss_tokens"][r] = len(ids), int(sum(mask))
    if fix_id:
        c["id"][r] = content_id(np.array(ids), np.array(mask))
    return c


def test_a_sample_longer_than_max_seq_len_fails_lengths(merged):
    plant(merged, lambda c: _edit_row(c, 3, ids=c["input_ids"][3] + [7] * L, mask=c["loss_mask"][3] + [1] * L))
    failed, msg, checks = failed_checks(merged)
    assert "lengths" in failed and checks["lengths"]["too_long"] == 1
    assert "1 samples longer than max_seq_len 24" in msg


def test_a_mask_value_other_than_0_1_fails_masks(merged):
    plant(merged, lambda c: _edit_row(c, 0, mask=[2] + c["loss_mask"][0][1:]))
    failed, _, checks = failed_checks(merged)
    assert "masks" in failed and checks["masks"]["bad_values"] == 1


def test_a_mask_shorter_than_its_ids_fails_masks(merged):
    def edit(c):
        c["loss_mask"][2] = c["loss_mask"][2][:-1]
        return c
    plant(merged, edit)
    failed, _, checks = failed_checks(merged)
    assert "masks" in failed and checks["masks"]["bad_lengths"] == 1


def test_an_altered_token_fails_matches_source(merged):
    plant(merged, lambda c: _edit_row(c, 5, ids=[(c["input_ids"][5][0] + 1) % 1000] + c["input_ids"][5][1:]))
    failed, msg, checks = failed_checks(merged)
    # The new id also moves the sample in the id-sorted order, so the seeded order changes too.
    assert failed - {"reproducible"} == {"matches_source"} and checks["matches_source"]["mismatches"] == 1
    assert "1 of 130 samples differ from their prepared source" in msg


def test_an_id_that_is_not_the_content_hash_fails_ids(merged):
    plant(merged, lambda c: _edit_row(c, 1, ids=[5] + c["input_ids"][1][1:], fix_id=False))
    failed, _, checks = failed_checks(merged)
    assert "ids" in failed and checks["ids"]["bad_ids"] == 1


def test_unshuffled_output_fails_shuffled_and_uniform_positions(merged):
    man = storage.read_json(os.path.join(merged, "manifest.json"))
    prepared = man["prepared"]

    def unshuffle(c):
        rank = {}
        for name in sorted(man["sources"]):
            ids = pq.read_table(os.path.join(prepared, name, "tokenized.parquet")).column("id").to_pylist()
            rank.update({(name, sid): (name, i) for i, sid in enumerate(ids)})
        order = sorted(range(len(c["id"])), key=lambda r: rank[(c["source"][r], c["source_id"][r])])
        return {k: [v[r] for r in order] for k, v in c.items()}
    plant(merged, unshuffle)
    failed, msg, checks = failed_checks(merged)
    assert {"shuffled", "uniform_positions", "reproducible"} <= failed
    assert "the output is in input order" in msg and "positions not uniform for a (KS D=" in msg
    assert checks["uniform_positions"]["sources"]["a"]["p_value"] < 1e-6


def test_another_seed_fails_reproducible(merged):
    man = storage.read_json(os.path.join(merged, "manifest.json"))
    man["seed"] = 6
    storage.write_json(os.path.join(merged, "manifest.json"), man)
    failed, msg, checks = failed_checks(merged)
    assert failed == {"reproducible"} and checks["reproducible"]["positions_differ"] > 100


def test_not_enough_free_space_or_time_fails_extraction_space(merged):
    failed, msg, checks = failed_checks(merged, hidden_size=10**12)
    assert failed == {"extraction_space"} and "short by" in msg
    assert checks["extraction_space"]["bytes_per_token"] == 4 * 10**12 * 2 + 5
    failed, msg, _ = failed_checks(merged, tokens_per_s=1e-3, max_hours=1.0)
    assert failed == {"extraction_space"} and "over the max_hours limit of 1.0 h by" in msg


def test_ks_uniform_accepts_uniform_and_rejects_clustered():
    rng = np.random.default_rng(0)
    ps = [ks_uniform(rng.random(200))[1] for _ in range(300)]
    assert 0.4 < np.mean(ps) < 0.6 and np.mean(np.array(ps) < 0.05) < 0.1  # p-values ~ uniform under H0
    d, p = ks_uniform(rng.random(200) * 0.5)
    assert d > 0.4 and p < 1e-12
    # A textbook value: n=100, D=0.1 gives p ~ 0.27 (asymptotic Kolmogorov with Stephens' correction).
    u = (np.arange(100) + 0.5) / 100 * 0.9
    d, p = ks_uniform(u)
    assert abs(d - 0.1045) < 1e-3 and 0.15 < p < 0.3


def test_cli_verify_exits_non_zero_on_failure(merged, capsys):
    assert cli_main(["verify", "--merged", merged]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True
    assert cli_main(["verify", "--merged", merged, "--hidden-size", str(10**12)]) != 0
    assert "verify gate failed: extraction_space" in capsys.readouterr().err


def test_verify_and_vocab_on_s3(tmp_path, s3_bucket):
    from eagle3.vocab import VocabConfig, vocab, load_vocab

    rng = np.random.default_rng(12)
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(rng, 30), "b": random_rows(rng, 20)})
    merged = f"{s3_bucket}/merged"
    merge(MergeConfig(prepared=prep, out=merged, max_seq_len=L))
    result = verify(VerifyConfig(merged, store=f"{s3_bucket}/store"))
    assert result["passed"] and storage.read_json(f"{merged}/verify.json")["passed"] is True
    space = {c["name"]: c for c in result["checks"]}["extraction_space"]
    assert space["free_bytes"] is None and "unknown (object store)" in space["detail"]
    info = vocab(VocabConfig(merged=merged, out=f"{s3_bucket}/vocab", draft_vocab_size=32))
    assert info["vocab_size"] == 1000 and load_vocab(f"{s3_bucket}/vocab")[0].shape == (32,)


def test_a_cut_train_parquet_fails_the_gate_on_its_checksum_alone(merged):
    path = os.path.join(merged, "train.parquet")
    with open(path, "r+b") as f:  # the other checks would have to open a file with no footer
        f.truncate(os.path.getsize(path) // 2)
    failed, message, checks = failed_checks(merged)
    assert failed == {"checksums"} and list(checks) == ["checksums"]
    assert "run `eagle3 merge --out" in message


def test_an_empty_merge_is_refused(tmp_path, merged):
    from eagle3.errors import InputError

    plant(merged, lambda cols: {k: [] for k in cols})
    with pytest.raises(InputError, match="train.parquet holds no samples"):
        verify(VerifyConfig(merged))


DATA_CHECKS = ("checksums", "lengths", "masks", "ids", "accounting", "matches_source", "shuffled", "uniform_positions",
               "reproducible")


def _several_defects(c):
    c = _edit_row(c, 5, ids=[(c["input_ids"][5][0] + 1) % 1000] + c["input_ids"][5][1:])
    c = _edit_row(c, 0, mask=[2] + c["loss_mask"][0][1:])
    c = _edit_row(c, 1, ids=[5] + c["input_ids"][1][1:], fix_id=False)
    return {k: v[:-1] for k, v in c.items()}


def _short_mask(c):
    c["loss_mask"][2] = c["loss_mask"][2][:-1]
    return c


@pytest.mark.parametrize("variant, edit", [("correct", lambda c: c), ("planted", _several_defects),
                                           ("short_mask", _short_mask)])
def test_files_are_read_in_batches_with_the_whole_file_result(merged, monkeypatch, variant, edit):
    """Past 2^31 tokens a whole list<int32> column cannot be concatenated ("offset overflow"), and memory would
    grow with the dataset: the gate reads train.parquet and the prepared files batch by batch, and its data checks
    give what whole-file reading gave on the same rows (data_checks_golden.json, recorded with that reader)."""
    plant(merged, edit, row_group_size=16)
    prepared = storage.read_json(os.path.join(merged, "manifest.json"))["prepared"]
    for name in "abc":
        path = os.path.join(prepared, name, "tokenized.parquet")
        pq.write_table(pq.read_table(path), path, row_group_size=16)
    assert pq.ParquetFile(os.path.join(merged, "train.parquet")).num_row_groups > 5

    def whole_file(*args, **kwargs):
        raise pa.ArrowInvalid("offset overflow while concatenating arrays")
    monkeypatch.setattr(pq, "read_table", whole_file)
    monkeypatch.setattr(pq.ParquetFile, "read", whole_file)
    monkeypatch.setattr(pa, "concat_arrays", whole_file)
    monkeypatch.setattr(stage, "BATCH_ROWS", 7)  # rows split over batches, a repeated id in two of them
    try:
        verify(VerifyConfig(merged))
    except GateFailed:
        assert variant != "correct"
    result = json.loads(open(os.path.join(merged, "verify.json")).read())
    got = {"samples": result["samples"], "tokens": result["tokens"], "content_hash": result["content_hash"],
           "failed": [n for n in result["failed"] if n in DATA_CHECKS],
           "checks": [c for c in result["checks"] if c["name"] in DATA_CHECKS]}
    with open(os.path.join(os.path.dirname(__file__), "data_checks_golden.json")) as f:
        assert got == json.load(f)[variant]
