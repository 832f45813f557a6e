"""An extract (re)start on an S3 store checks its shards by size, one HEAD each, and downloads none of them: a
retry after an out-of-memory, or on another worker, downloaded everything the task had written (up to ~1 TB)
into the never-evicted cache just to hash it. The full check stays: HiddenStateStore.verify(), and
EAGLE3_VERIFY=always for extract's own."""

from __future__ import annotations

import shutil

import pytest

from eagle3 import storage
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore

pytestmark = pytest.mark.precision


@pytest.fixture
def s3_run(s3_bucket, tmp_path, tiny_llama_dir, merged_small, monkeypatch):
    """A store extracted to S3 (8-10 shards), the local cache emptied, and every object download counted."""
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    cfg = ExtractConfig(merged=merged_small, model=tiny_llama_dir, out=f"{s3_bucket}/store", device="cpu",
                        token_budget=256, shard_mb=0.03, storage_option="fp8", progress_every_s=0)
    assert extract(cfg)["shards_written"] > 5
    shutil.rmtree(tmp_path / "cache")
    downloads, get_file = [], storage.get_file
    monkeypatch.setattr(storage, "get_file", lambda uri, local: (downloads.append(uri), get_file(uri, local))[1])
    return cfg, HiddenStateStore(f"{s3_bucket}/store"), downloads


def _shard_downloads(downloads: list[str]) -> list[str]:
    return [d for d in downloads if "/shard-" in d]


def test_a_restart_with_nothing_to_do_downloads_no_shard(s3_run, tmp_path):
    cfg, store, downloads = s3_run
    again = extract(cfg)
    assert (again["samples_extracted"], again["shards_repaired"], again["shards_dropped"]) == (0, [], [])
    assert _shard_downloads(downloads) == []
    assert not (tmp_path / "cache" / "s3").exists()
    for name, entry in store.shards.items():  # what the check compared with
        assert entry["bytes"] == storage.file_size(storage.join(store.uri, name))


def test_a_shard_of_another_size_is_re_extracted_without_downloading(s3_run):
    cfg, store, downloads = s3_run
    name = sorted(store.shards)[2]
    uri = storage.join(store.uri, name)
    good = storage.read_bytes(uri)
    storage.write_bytes(uri, good[:-100])  # what a HEAD sees: 100 bytes short
    summary = extract(cfg)
    assert summary["shards_repaired"] == [name] and summary["samples_extracted"] == store.shards[name]["samples"]
    assert _shard_downloads(downloads) == []
    assert storage.read_bytes(uri) == good  # the same batches, the same bytes
    assert HiddenStateStore(store.uri).verify() == []


def test_damage_of_the_same_size_needs_the_full_check(s3_run, monkeypatch):
    """An object overwritten with other bytes of the same size passes a HEAD; verify() and EAGLE3_VERIFY=always
    hash it. An index entry from before sizes were recorded is hashed as it always was."""
    cfg, store, downloads = s3_run
    sized, unsized = sorted(store.shards)[1:3]
    for name in (sized, unsized):
        uri = storage.join(store.uri, name)
        data = bytearray(storage.read_bytes(uri))
        data[-5] ^= 0xFF
        storage.write_bytes(uri, bytes(data))
    index_uri = storage.join(store.uri, "index-0of1.json")
    index = storage.read_json(index_uri)
    del index[unsized]["bytes"]
    storage.write_json(index_uri, index)
    summary = extract(cfg)
    assert summary["shards_repaired"] == [unsized]
    assert _shard_downloads(downloads) == [storage.join(store.uri, unsized)]
    problems = HiddenStateStore(store.uri).verify()
    assert len(problems) == 1 and sized in problems[0] and "sha256" in problems[0]
    monkeypatch.setenv("EAGLE3_VERIFY", "always")
    assert extract(cfg)["shards_repaired"] == [sized]
    assert HiddenStateStore(store.uri).verify() == []
