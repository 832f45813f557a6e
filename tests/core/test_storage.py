"""Storage layer against the local disk and a real S3 endpoint (moto server)."""

import os

import pytest

from eagle3 import storage


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "root")
    return request.getfixturevalue("s3_bucket") + "/prefix"


def test_write_read_list_roundtrip(root):
    digest = storage.write_json(storage.join(root, "a", "x.json"), {"k": 1})
    storage.write_bytes(storage.join(root, "b.bin"), b"\x00\x01")
    assert storage.read_json(storage.join(root, "a", "x.json")) == {"k": 1}
    assert storage.read_bytes(storage.join(root, "b.bin")) == b"\x00\x01"
    assert storage.list_files(root) == ["a/x.json", "b.bin"]
    assert digest == storage.sha256_bytes(storage.read_bytes(storage.join(root, "a", "x.json")))
    assert storage.exists(storage.join(root, "b.bin"))
    assert not storage.exists(storage.join(root, "missing"))
    storage.delete(storage.join(root, "b.bin"))
    assert storage.list_files(root) == ["a/x.json"]


def test_put_get_file_multipart(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "MULTIPART_THRESHOLD", 5 * 1024 * 1024)  # S3's minimum part size
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(12 * 1024 * 1024))
    uri = f"{s3_bucket}/big.bin"
    digest = storage.put_file(src, uri)
    head = storage._client().head_object(Bucket=s3_bucket[5:], Key="big.bin")
    assert "-" in head["ETag"], "expected a multipart ETag"
    local = storage.local_path(uri)
    assert storage.sha256_file(local) == digest


def test_staged_dir_uploads_on_success_only(s3_bucket):
    with storage.staged_dir(f"{s3_bucket}/out") as d:
        (d / "f.txt").write_text("hello")
    assert storage.read_text(f"{s3_bucket}/out/f.txt") == "hello"
    with pytest.raises(RuntimeError):
        with storage.staged_dir(f"{s3_bucket}/out2") as d:
            (d / "f.txt").write_text("partial")
            raise RuntimeError("stage failed")
    assert storage.list_files(f"{s3_bucket}/out2") == []


def test_local_write_is_atomic_no_temp_left(tmp_path):
    p = tmp_path / "x" / "y.json"
    storage.write_json(p, [1, 2])
    assert sorted(os.listdir(p.parent)) == ["y.json"]
