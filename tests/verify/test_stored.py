"""A re-run over an existing store: the gate prices only the samples the store lacks (eagle3.verify.stored), as
extract skips the others; the store is filled by `eagle3 extract` itself, so the gate's store key is extract's."""

from __future__ import annotations

import os

import pytest

from eagle3 import storage, storage_options
from eagle3.errors import GateFailed
from eagle3.extract import ExtractConfig, extract
from eagle3.verify import VerifyConfig, verify
from tests.verify.test_verify import merged  # noqa: F401 - the fixture


def _space(result: dict) -> dict:
    return {c["name"]: c for c in result["checks"]}["extraction_space"]


def test_a_rerun_prices_only_the_samples_not_yet_stored(merged, tiny_llama_dir, tmp_path, monkeypatch):  # noqa: F811
    root = str(tmp_path / "store")
    gate = dict(model=tiny_llama_dir, store=root, storage_option="fp8")
    result = verify(VerifyConfig(merged, **gate))
    full, n, tokens = _space(result), result["samples"], result["tokens"]
    assert full["stored_samples"] == 0 and full["bytes"] == storage_options.store_bytes("fp8", 64, tokens, n)
    half = full["bytes"] // 2

    def tight(**options) -> tuple[dict, str]:
        """verify.json and the failure message of the gate on a disk with room for half the set."""
        with monkeypatch.context() as patch:  # only the gate's disk: extract below sees the real one
            patch.setattr(storage, "free_bytes", lambda uri: half)
            try:
                verify(VerifyConfig(merged, **gate, **options))
                message = ""
            except GateFailed as err:
                message = str(err)
        return storage.read_json(f"{merged}/verify.json"), message

    def fill(shard: str) -> None:
        extract(ExtractConfig(merged=merged, model=tiny_llama_dir, out=root, storage_option="fp8", shard=shard,
                              device="cpu", progress_every_s=0))

    result, message = tight()  # nothing stored: the whole set does not fit
    assert result["failed"] == ["extraction_space"] and "short by" in message
    assert f"0 of {n} samples already stored" in message and _space(result)["bytes"] == full["bytes"]
    fill("0/2")  # part of the samples stored: the rest is priced
    space = _space(tight()[0])
    m = space["stored_samples"]
    assert 0 < m < n and f"{m} of {n} samples already stored" in space["detail"]
    assert space["bytes"] == storage_options.store_bytes("fp8", 64, tokens - space["stored_tokens"], n - m)
    fill("1/2")  # all stored: nothing to extract, so it fits (and takes no time) whatever the disk
    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*")}
    result, message = tight(training_mode="auto", max_hours=1e-9)
    space = _space(result)
    assert result["passed"] and result["stored_samples"] == space["stored_samples"] == n
    assert f"0 of {tokens} tokens to extract ({n} of {n} samples already stored: store " in space["detail"]
    assert space["hours"] == 0 and space["bytes"] <= half
    # the mode decision prices the same count: offline, since the store needs nothing more
    verdict = result["training_mode"]
    assert verdict["mode"] == "offline" and verdict["costs"]["stored_samples"] == n
    assert verdict["costs"]["offline"]["bytes"] == space["bytes"] and verdict["costs"]["online"]["target_hours"] == 0
    assert f"{n} of {n} samples already stored" in verdict["reason"]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*")} == files  # the gate only reads


def test_another_storage_option_or_no_model_counts_nothing_stored(merged, tiny_llama_dir, tmp_path):  # noqa: F811
    root = str(tmp_path / "store")
    extract(ExtractConfig(merged=merged, model=tiny_llama_dir, out=root, storage_option="fp8", device="cpu",
                          progress_every_s=0))
    other = _space(verify(VerifyConfig(merged, model=tiny_llama_dir, store=root, storage_option="bf16")))
    assert other["stored_samples"] == 0 and other["store"] is None and "no store" in other["detail"]
    layers = _space(verify(VerifyConfig(merged, model=tiny_llama_dir, store=root, storage_option="fp8",
                                        aux_layers=(0, 1, 2))))
    assert layers["stored_samples"] == 0  # another key: extract with these layers fills another folder
    unnamed = _space(verify(VerifyConfig(merged, hidden_size=64, store=root, storage_option="fp8")))
    assert unnamed["stored_samples"] == 0 and "no target model given" in unnamed["detail"]


@pytest.mark.parametrize("target", ["local", "s3"])
def test_an_s3_store_is_read_from_its_indexes(tmp_path, s3_bucket, tiny_llama_dir, monkeypatch, target):
    """An s3 target's store is found by the name its store.json records: its fingerprint would need the weights
    mirrored onto the gate's worker."""
    import numpy as np

    from eagle3 import target as targets
    from eagle3.merge import MergeConfig, merge
    from tests.merge.prepared_factory import random_rows, write_prepared

    rng = np.random.default_rng(13)
    prep = write_prepared(tmp_path / "prep", {"a": random_rows(rng, 20), "b": random_rows(rng, 10)})
    merged_uri = f"{s3_bucket}/merged-{target}"
    merge(MergeConfig(prepared=prep, out=merged_uri, max_seq_len=24))
    model = tiny_llama_dir
    if target == "s3":
        model = f"{s3_bucket}/models/tiny"
        for f in os.listdir(tiny_llama_dir):
            storage.put_file(os.path.join(tiny_llama_dir, f), f"{model}/{f}")
    root = f"{s3_bucket}/store-{target}"
    extract(ExtractConfig(merged=merged_uri, model=model, out=root, storage_option="fp8", device="cpu",
                          progress_every_s=0))
    if target == "s3":
        monkeypatch.setattr(targets, "model_fingerprint", lambda folder: pytest.fail(f"the gate hashed {folder}"))
    result = verify(VerifyConfig(merged_uri, model=model, store=root, storage_option="fp8"))
    space = _space(result)
    assert result["passed"] and result["stored_samples"] == result["samples"] == 30
    assert ("matched by model name" in space["detail"]) == (target == "s3")


def test_the_gate_never_hashes_the_targets_weights(merged, tiny_llama_dir, tmp_path, monkeypatch):  # noqa: F811
    """On a worker that never fingerprinted the target (the CPU worker verify runs on), hashing it would read
    every weight file (a 1 TB target: many minutes): the gate matches the store by name there, and uses the
    fingerprint only where this machine has it cached."""
    from eagle3 import target

    root = str(tmp_path / "store")
    extract(ExtractConfig(merged=merged, model=tiny_llama_dir, out=root, storage_option="fp8", device="cpu",
                          progress_every_s=0))
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cold-cache"))  # a machine that never hashed it
    hashed = []
    monkeypatch.setattr(target, "fingerprint_files", lambda *a, **k: hashed.append(a) or "0" * 64)
    space = _space(verify(VerifyConfig(merged, model=tiny_llama_dir, store=root, storage_option="fp8")))
    assert hashed == [] and space["stored_samples"] > 0 and "matched by model name" in space["detail"]
