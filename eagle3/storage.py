"""One small storage layer for local paths and ``s3://bucket/key`` URIs.

Every stage reads and writes through these functions, so every path a user
gives may be local or on S3. Writes are atomic: a local file is written to a
temporary name and renamed; an S3 object appears only when its single PUT or
its multipart upload completes.

S3 settings come from the environment, as boto3 reads them
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``),
plus ``EAGLE3_S3_ENDPOINT_URL`` (or boto3's own ``AWS_ENDPOINT_URL``) for an
S3-compatible store. The Airflow operators fill these from a connection.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

MULTIPART_THRESHOLD = 64 * 1024 * 1024  # above this, uploads go multipart
_CHUNK = 8 * 1024 * 1024


def is_s3(uri: str | os.PathLike) -> bool:
    return str(uri).startswith("s3://")


def join(base: str | os.PathLike, *parts: str) -> str:
    """Join path parts; works for local paths and s3 URIs alike."""
    base = str(base)
    if is_s3(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(base, *parts))


def split_s3(uri: str) -> tuple[str, str]:
    rest = uri[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"not an s3 URI with a bucket: {uri!r} (expected s3://bucket/key)")
    return bucket, key


@functools.lru_cache(maxsize=None)
def _client():
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("EAGLE3_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client(
        "s3",
        endpoint_url=endpoint or None,
        config=Config(retries={"max_attempts": 5, "mode": "standard"}),
    )


def reset_client() -> None:
    """Forget the cached client (after the environment changed)."""
    _client.cache_clear()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def exists(uri: str | os.PathLike) -> bool:
    uri = str(uri)
    if not is_s3(uri):
        return os.path.exists(uri)
    bucket, key = split_s3(uri)
    from botocore.exceptions import ClientError

    try:
        _client().head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def read_bytes(uri: str | os.PathLike) -> bytes:
    uri = str(uri)
    if not is_s3(uri):
        return Path(uri).read_bytes()
    bucket, key = split_s3(uri)
    return _client().get_object(Bucket=bucket, Key=key)["Body"].read()


def read_text(uri: str | os.PathLike) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str | os.PathLike) -> Any:
    return json.loads(read_bytes(uri))


def _atomic_local_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(uri: str | os.PathLike, data: bytes) -> str:
    """Write atomically; return the sha256 of the data."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        _client().put_object(Bucket=bucket, Key=key, Body=data)
    else:
        _atomic_local_write(Path(uri), data)
    return sha256_bytes(data)


def write_text(uri: str | os.PathLike, text: str) -> str:
    return write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str | os.PathLike, obj: Any) -> str:
    return write_bytes(uri, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def put_file(local_path: str | os.PathLike, uri: str | os.PathLike) -> str:
    """Copy a local file to ``uri`` atomically; return its sha256.

    On S3, files over MULTIPART_THRESHOLD go up as a multipart upload, which
    becomes visible only once complete.
    """
    uri, local_path = str(uri), str(local_path)
    digest = sha256_file(local_path)
    if is_s3(uri):
        from boto3.s3.transfer import TransferConfig

        bucket, key = split_s3(uri)
        cfg = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD)
        _client().upload_file(local_path, bucket, key, Config=cfg)
    elif os.path.abspath(local_path) != os.path.abspath(uri):
        dest = Path(uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    return digest


def get_file(uri: str | os.PathLike, local_path: str | os.PathLike) -> None:
    uri, local_path = str(uri), str(local_path)
    Path(local_path).parent.mkdir(parents=True, exist_ok=True)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        tmp = local_path + ".part"
        _client().download_file(bucket, key, tmp)
        os.replace(tmp, local_path)
    else:
        shutil.copyfile(uri, local_path)


def cache_dir() -> Path:
    """Where downloaded S3 objects and converted models are cached."""
    return Path(os.environ.get("EAGLE3_CACHE", Path.home() / ".cache" / "eagle3"))


def local_path(uri: str | os.PathLike) -> str:
    """A local file holding the content of ``uri``.

    Local paths are returned as they are; S3 objects are downloaded once into
    the cache, keyed by their ETag, so a changed object is fetched again.
    """
    uri = str(uri)
    if not is_s3(uri):
        return uri
    bucket, key = split_s3(uri)
    etag = _client().head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
    dest = cache_dir() / "s3" / bucket / f"{key}.{etag}"
    if not dest.exists():
        get_file(uri, dest)
    return str(dest)


def list_files(prefix: str | os.PathLike) -> list[str]:
    """Relative names of all files below ``prefix`` (recursive, sorted)."""
    prefix = str(prefix)
    if not is_s3(prefix):
        root = Path(prefix)
        if not root.exists():
            return []
        return sorted(
            str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tmp")
        )
    bucket, key = split_s3(prefix)
    key = key.rstrip("/") + "/" if key else ""
    names = []
    for page in _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        names += [obj["Key"][len(key):] for obj in page.get("Contents", [])]
    return sorted(names)


def delete(uri: str | os.PathLike) -> None:
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        _client().delete_object(Bucket=bucket, Key=key)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(uri)


def free_bytes(uri: str | os.PathLike) -> int | None:
    """Free space at a destination; None when unknown (S3 has no such limit)."""
    uri = str(uri)
    if is_s3(uri):
        return None
    p = Path(uri).absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


@contextlib.contextmanager
def staged_dir(uri: str | os.PathLike) -> Iterator[Path]:
    """A local directory to write a stage's output into.

    Local: the directory itself. S3: a temporary directory whose files are
    uploaded (each atomically) when the block exits without error.
    """
    uri = str(uri)
    if not is_s3(uri):
        Path(uri).mkdir(parents=True, exist_ok=True)
        yield Path(uri)
        return
    with tempfile.TemporaryDirectory(prefix="eagle3-stage-") as tmp:
        yield Path(tmp)
        for p in sorted(Path(tmp).rglob("*")):
            if p.is_file():
                put_file(p, join(uri, str(p.relative_to(tmp))))


def local_dir(uri: str | os.PathLike) -> str:
    """A local copy of a whole directory (S3 prefixes are downloaded into the cache)."""
    uri = str(uri)
    if not is_s3(uri):
        return uri
    bucket, key = split_s3(uri)
    root = cache_dir() / "s3dirs" / bucket / key.strip("/")
    for name in list_files(uri):
        src = local_path(join(uri, name))
        dest = root / name
        if not dest.exists() or dest.stat().st_size != os.path.getsize(src):
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
    return str(root)
