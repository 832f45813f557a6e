"""Storage layer against the local disk and a real S3 endpoint (moto server)."""

import os

import pytest

from eagle3 import storage
from eagle3.errors import InputError


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
    assert storage.file_size(storage.join(root, "b.bin")) == 2  # on S3 a HEAD: nothing downloaded
    assert storage.file_size(storage.join(root, "missing")) is None
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


@pytest.mark.parametrize("folder", [storage.staged_dir, storage.atomic_dir])
def test_s3_folders_upload_a_tree_on_success_only(s3_bucket, folder):
    with folder(f"{s3_bucket}/out") as d:
        (d / "f.txt").write_text("hello")
        (d / "sub").mkdir()
        (d / "sub" / "g.txt").write_text("g")
    assert storage.read_text(f"{s3_bucket}/out/f.txt") == "hello"
    assert storage.list_files(f"{s3_bucket}/out") == ["f.txt", "sub/g.txt"]
    with pytest.raises(RuntimeError):
        with folder(f"{s3_bucket}/out2") as d:
            (d / "f.txt").write_text("partial")
            raise RuntimeError("stage failed")
    assert storage.list_files(f"{s3_bucket}/out2") == []


def test_local_dir_follows_a_reupload_of_the_same_size_and_a_deletion(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    draft = f"{s3_bucket}/drafts/d1"
    storage.write_bytes(f"{draft}/model.safetensors", b"old weights")
    storage.write_bytes(f"{draft}/extra.json", b"{}")
    first = storage.local_dir(draft)
    assert open(os.path.join(first, "model.safetensors"), "rb").read() == b"old weights"
    # a re-export: same shapes, so the same size, other bytes; and a file the new export no longer has
    storage.write_bytes(f"{draft}/model.safetensors", b"new weights")
    storage.delete(f"{draft}/extra.json")
    again = storage.local_dir(draft)
    assert again == first and open(os.path.join(again, "model.safetensors"), "rb").read() == b"new weights"
    assert sorted(os.listdir(again)) == ["model.safetensors"]


def test_local_write_is_atomic_no_temp_left(tmp_path):
    p = tmp_path / "x" / "y.json"
    storage.write_json(p, [1, 2])
    assert sorted(os.listdir(p.parent)) == ["y.json"]


def test_check_sha256_names_the_file_both_digests_and_the_repair(root):
    uri = storage.join(root, "data.bin")
    digest = storage.write_bytes(uri, b"intact")
    assert open(storage.check_sha256(uri, digest, "unused"), "rb").read() == b"intact"  # the local copy
    assert storage.check_sha256(uri, None, "unused")  # nothing recorded (an older file): not checked
    storage.write_bytes(uri, b"damaged")
    got = storage.sha256_bytes(b"damaged")
    with pytest.raises(InputError) as e:
        storage.check_sha256(uri, digest, "re-run `eagle3 x`", recorded_in="stats.json")
    assert str(e.value) == (f"{uri}: sha256 {got} differs from stats.json's {digest}: the file changed or was "
                            "damaged after it was written; re-run `eagle3 x`")
    assert storage.sha256_problem(uri, digest, "stats.json") == f"sha256 {got} differs from stats.json's {digest}"
    assert storage.sha256_problem(uri, got) is None
    assert storage.sha256_problem(uri, digest, digest=digest) is None  # a digest the caller computed is trusted


def test_a_damaged_json_artifact_is_named_and_still_a_value_error(tmp_path):
    from eagle3.errors import DamagedFile

    path = tmp_path / "manifest.json"
    path.write_text('{"samples": 3, "checks')  # a cut write
    with pytest.raises(DamagedFile, match=r"manifest.json: not valid JSON \(Unterminated string.*truncated or damaged"):
        storage.read_json(str(path))
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match="manifest.json: not valid JSON"):  # callers that treat it as absent
        storage.read_json(str(path))
    assert issubclass(DamagedFile, InputError) and DamagedFile.EXIT_CODE == InputError.EXIT_CODE
