"""One small storage layer for local paths and ``s3://bucket/key`` URIs.

Every stage reads and writes through these functions, so every path a user
gives may be local or on S3. Writes are atomic: a local file is written to a
temporary name and renamed; an S3 object appears only when its single PUT or
its multipart upload completes.

S3 settings come from :func:`configure_s3` (the Airflow operators pass their
connection's), else from the environment as boto3 reads it (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``), plus ``EAGLE3_S3_ENDPOINT_URL``
(or boto3's own ``AWS_ENDPOINT_URL``) for an S3-compatible store.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
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


@dataclass(frozen=True)
class S3Settings:
    """Where and how to reach S3. Unset fields fall back to what boto3 reads itself (environment, files)."""

    endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO, moto, ...); None: AWS."""
    access_key: str | None = None
    secret_key: str | None = None
    region: str | None = None

    def env(self) -> dict[str, str]:
        """The same settings as environment variables, for a child process (never this process's own)."""
        pairs = {ENDPOINT_ENV: self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                 "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region}
        return {k: v for k, v in pairs.items() if v}


ENDPOINT_ENV = "EAGLE3_S3_ENDPOINT_URL"
_settings: S3Settings | None = None


def configure_s3(settings: S3Settings | None) -> None:
    """Use these S3 settings in this process (the Airflow operators pass their connection's); None: the
    environment again."""
    global _settings
    _settings = settings
    reset_client()


@functools.lru_cache(maxsize=None)
def _client():
    import boto3
    from botocore.config import Config

    s = _settings or S3Settings()
    endpoint = s.endpoint_url or os.environ.get(ENDPOINT_ENV) or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client(
        "s3",
        endpoint_url=endpoint or None,
        aws_access_key_id=s.access_key, aws_secret_access_key=s.secret_key, region_name=s.region,
        config=Config(retries={"max_attempts": 5, "mode": "standard"}),
    )


def reset_client() -> None:
    """Forget the cached client (after the settings or the environment changed)."""
    _client.cache_clear()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def sha256_problem(uri: str | os.PathLike, expected: str | None, recorded_in: str = "the recorded checksum",
                   *, digest: str | None = None) -> str | None:
    """What is wrong with the file at ``uri`` against the sha256 ``expected`` that ``recorded_in`` (e.g.
    "stats.json") holds: ``"sha256 <got> differs from stats.json's <expected>"``, or None when it matches or
    nothing is expected (a file written before its checksum was recorded). ``digest``: the file's sha256
    when the caller already computed it."""
    if not expected:
        return None
    got = digest or sha256_file(local_path(uri))
    return None if got == expected else f"sha256 {got} differs from {recorded_in}'s {expected}"


def check_sha256(uri: str | os.PathLike, expected: str | None, repair_hint: str,
                 recorded_in: str = "the recorded checksum") -> str:
    """The local path of ``uri`` after checking its sha256 against ``expected`` (see ``sha256_problem``);
    an InputError naming the file, both digests and ``repair_hint`` when they differ."""
    from eagle3.errors import InputError

    local = local_path(uri)
    problem = sha256_problem(local, expected, recorded_in)
    if problem:
        raise InputError(f"{problem}: the file changed or was damaged after it was written; {repair_hint}",
                         file=str(uri))
    return local


def exists(uri: str | os.PathLike) -> bool:
    uri = str(uri)
    if not is_s3(uri):
        return os.path.exists(uri)
    return _head(uri) is not None


def file_size(uri: str | os.PathLike) -> int | None:
    """The size in bytes of the file at ``uri``, None when there is none; on S3 one HEAD, nothing downloaded."""
    uri = str(uri)
    if not is_s3(uri):
        try:
            return os.path.getsize(uri)
        except FileNotFoundError:
            return None
    head = _head(uri)
    return None if head is None else int(head["ContentLength"])


def _head(uri: str) -> dict | None:
    """S3's HEAD answer for the object ``uri``; None when there is no such object."""
    bucket, key = split_s3(uri)
    from botocore.exceptions import ClientError

    try:
        return _client().head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
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
    """The parsed JSON at ``uri``; a DamagedFile naming it when it does not parse (a FileNotFoundError when
    it is missing)."""
    data = read_bytes(uri)
    try:
        return json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        from eagle3.errors import DamagedFile

        raise DamagedFile(f"not valid JSON ({e}): the file is truncated or damaged; re-run the stage that wrote "
                          "it (or restore the file)", file=str(uri)) from None


TMP_SUFFIX = ".tmp"
"""Every temporary file or folder this package makes next to a destination is
``.<name>.<pid>-<host>.<random>.tmp`` (:func:`tmp_prefix`): a reader never takes one for an artifact, and
leftovers of a killed run can be told from a live run's and swept (:func:`sweep_tmp`)."""

STALE_TMP_AGE_S = 24 * 3600
"""A temporary entry whose owner cannot be checked (another host, or an older name without an owner) is
swept only when nothing in it changed for this long."""


def _host_tag() -> str:
    import socket

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def tmp_prefix(name: str) -> str:
    """``.<name>.<pid>-<host>.``: the prefix of a temporary entry named for ``name`` and owned by this process."""
    return f".{name}.{os.getpid()}-{_host_tag()}."


def _owner_alive(entry: str) -> bool | None:
    """True/False when ``entry`` names its owner on this host (whether that process still runs); None
    when the owner cannot be checked from here."""
    import re

    m = re.search(r"\.(\d+)-([0-9a-f]{8})\.[^./]+(?:\.old)?\.tmp$", entry)
    if not m or m.group(2) != _host_tag():
        return None
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir():
        for p in path.rglob("*"):
            with contextlib.suppress(OSError):
                newest = max(newest, p.lstat().st_mtime)
    return newest


def sweep_tmp(folder: str | os.PathLike, pattern: str = ".*" + TMP_SUFFIX, *,
              max_age_s: float = STALE_TMP_AGE_S) -> list[str]:
    """Remove the temporary entries in ``folder`` (matching ``pattern``) that a killed run left behind.

    Never a live run's: an entry whose owner (pid, host) is a running process on this host is kept; one
    whose owner cannot be checked (another host, or no owner in its name) is removed only when nothing in
    it changed for ``max_age_s``. Returns the removed paths. S3 folders: nothing to do (uploads are
    all-or-nothing there).
    """
    import time

    if is_s3(folder) or not Path(folder).is_dir():
        return []
    removed = []
    now = time.time()
    for p in sorted(Path(folder).glob(pattern)):
        alive = _owner_alive(p.name)
        try:
            if alive or (alive is None and now - _newest_mtime(p) < max_age_s):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue
        removed.append(str(p))
    if removed:
        import logging

        logging.getLogger(__name__).info("swept %d temporary entries of killed runs in %s: %s", len(removed),
                                         folder, ", ".join(Path(r).name for r in removed[:5]))
    return removed


def kill_point(name: str) -> None:
    """Crash-test hook: with ``$EAGLE3_KILL_AT=<point>:<n>`` this process SIGKILLs itself the n-th time it
    reaches a matching point (``<point>`` is a name, a family such as ``publish`` for every
    ``publish:<file>``, or ``*`` for all); ``$EAGLE3_KILL_LOG=FILE`` appends each point reached, one a line.
    A no-op unless one of them is set (tests/crash loops over the logged points)."""
    at, log_file = os.environ.get(KILL_AT_ENV), os.environ.get(KILL_LOG_ENV)
    if not at and not log_file:
        return
    if log_file:
        with open(log_file, "a") as f:
            f.write(name + "\n")
    if at:
        want, _, n = at.rpartition(":")
        if want == "*" or name == want or name.startswith(want + ":"):
            _kill_hits[0] += 1
            if _kill_hits[0] == int(n):
                import signal

                os.kill(os.getpid(), signal.SIGKILL)


KILL_AT_ENV, KILL_LOG_ENV = "EAGLE3_KILL_AT", "EAGLE3_KILL_LOG"
_kill_hits = [0]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(uri: str | os.PathLike) -> Iterator[Path]:
    """A local path to write a file into; when the block ends without error it appears at ``uri`` whole.

    Local: a temporary name in the destination folder, fsynced and renamed over ``uri``. S3: a temporary
    local file, uploaded (multipart above MULTIPART_THRESHOLD; an object is visible only once complete).
    On error nothing is published and the temporary file is removed.
    """
    uri = str(uri)
    if is_s3(uri):
        with tempfile.TemporaryDirectory(prefix="eagle3-upload-") as tmp:
            path = Path(tmp, uri.rsplit("/", 1)[-1])
            yield path
            _upload(path, uri)
        return
    dest = Path(uri)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(dest.name), suffix=TMP_SUFFIX, dir=dest.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        kill_point(f"publish:{dest.name}")
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False, changing nothing,
    where the C library or the filesystem cannot."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


@contextlib.contextmanager
def atomic_dir(uri: str | os.PathLike) -> Iterator[Path]:
    """A local folder to fill; when the block ends without error it appears at ``uri`` whole.

    Local: a temporary folder beside ``uri``, renamed into place; an existing folder of that name is swapped
    with it atomically (Linux's RENAME_EXCHANGE), then removed; where the filesystem cannot swap, it is moved
    aside first (a kill between the two renames leaves the old one under a ``.tmp`` name and nothing at
    ``uri``, never a half-written folder). S3: the files are uploaded
    one by one; callers that need all-or-nothing on S3 write a pointer file last (checkpoints do).
    """
    uri = str(uri)
    if is_s3(uri):
        with _uploaded_dir(uri, "eagle3-upload-") as tmp:
            yield tmp
        return
    dest = Path(uri)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(dest.name), suffix=TMP_SUFFIX, dir=dest.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        kill_point(f"publish:{dest.name}")
        if dest.exists() and _exchange(tmp, dest):
            pass  # one atomic swap: the old folder is now at tmp, removed below
        elif dest.exists():  # no RENAME_EXCHANGE (not Linux, or NFS): two renames, a window with nothing at dest
            trash = Path(tempfile.mkdtemp(prefix=tmp_prefix(dest.name), suffix=".old" + TMP_SUFFIX, dir=dest.parent))
            os.rename(dest, trash / dest.name)
            os.rename(tmp, dest)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, dest)
        _fsync_dir(dest.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_bytes(uri: str | os.PathLike, data: bytes) -> str:
    """Write atomically; return the sha256 of the data."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        _client().put_object(Bucket=bucket, Key=key, Body=data)
    else:
        with atomic_file(uri) as path:
            path.write_bytes(data)
    return sha256_bytes(data)


def write_text(uri: str | os.PathLike, text: str) -> str:
    return write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str | os.PathLike, obj: Any) -> str:
    return write_bytes(uri, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def _upload(local_path: str | os.PathLike, uri: str) -> None:
    from boto3.s3.transfer import TransferConfig

    bucket, key = split_s3(uri)
    cfg = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD)
    _client().upload_file(str(local_path), bucket, key, Config=cfg)


@contextlib.contextmanager
def _uploaded_dir(uri: str, prefix: str) -> Iterator[Path]:
    """A temporary local folder whose files are uploaded under the S3 prefix ``uri`` (each atomically) when the
    block ends without error."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)
        for p in sorted(Path(tmp).rglob("*")):
            if p.is_file():
                _upload(p, join(uri, str(p.relative_to(tmp))))


def put_file(local_path: str | os.PathLike, uri: str | os.PathLike) -> str:
    """Copy a local file to ``uri`` atomically; return its sha256."""
    uri, local_path = str(uri), str(local_path)
    digest = sha256_file(local_path)
    if is_s3(uri):
        _upload(local_path, uri)
    elif os.path.abspath(local_path) != os.path.abspath(uri):
        with atomic_file(uri) as tmp:
            shutil.copyfile(local_path, tmp)
    return digest


def publish_file(local_path: str | os.PathLike, uri: str | os.PathLike) -> None:
    """Move a finished local file to ``uri`` atomically (a rename when both are local; an upload to S3)."""
    uri = str(uri)
    if is_s3(uri):
        _upload(local_path, uri)
        os.unlink(local_path)
        return
    Path(uri).parent.mkdir(parents=True, exist_ok=True)
    kill_point(f"publish:{Path(uri).name}")
    try:
        os.replace(local_path, uri)
    except OSError:  # another file system: copy, then drop the original
        put_file(local_path, uri)
        os.unlink(local_path)


def get_file(uri: str | os.PathLike, local_path: str | os.PathLike) -> None:
    uri, local_path = str(uri), str(local_path)
    Path(local_path).parent.mkdir(parents=True, exist_ok=True)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        tmp = _unique_tmp(Path(local_path))  # tasks on one host may fetch the same object at once
        try:
            _client().download_file(bucket, key, str(tmp))
            os.replace(tmp, local_path)
        finally:
            tmp.unlink(missing_ok=True)
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
    with _uploaded_dir(uri, "eagle3-stage-") as tmp:
        yield tmp


def _unique_tmp(dest: Path) -> Path:
    """A temporary name next to ``dest`` that no other process or thread uses (:func:`tmp_prefix`)."""
    import uuid

    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.with_name(f"{tmp_prefix(dest.name)}{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")


def local_dir(uri: str | os.PathLike, only: tuple[str, ...] | None = None) -> str:
    """A local copy of a whole directory (S3 prefixes are mirrored into the cache); ``only``: just the files whose
    relative names match these glob patterns, in a mirror of their own (a tokenizer without the weights).

    Each file is copied from its ETag-keyed `local_path`, and the mirror remembers which object version
    each of its files is (``<mirror>.etags.json``): a re-uploaded object is copied again even when its size
    did not change (a re-exported draft of the same shapes), and a file no longer under the prefix leaves
    the mirror, so a reader never sees a stale or a deleted file. Tasks on one host may mirror the same prefix
    at once: every file and the index are published by rename from names of their own."""
    uri = str(uri)
    if not is_s3(uri):
        return uri
    bucket, key = split_s3(uri)
    root = cache_dir() / "s3dirs" / bucket / key.strip("/")
    if only is not None:
        root = root.with_name(root.name + "@" + sha256_bytes("\n".join(sorted(only)).encode())[:12])
    index_path = root.with_name(root.name + ".etags.json")
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    names = [n for n in list_files(uri) if only is None or any(fnmatch.fnmatchcase(n, pat) for pat in only)]
    current = {}
    for name in names:
        src = local_path(join(uri, name))  # its file name carries the object's ETag
        dest = root / name
        if index.get(name) != os.path.basename(src) or not dest.exists():
            tmp = _unique_tmp(dest)
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
        current[name] = os.path.basename(src)
    if root.exists():
        for path in root.rglob("*"):
            if path.is_file() and not path.name.endswith(TMP_SUFFIX) and str(path.relative_to(root)) not in current:
                path.unlink(missing_ok=True)
    tmp = _unique_tmp(index_path)
    tmp.write_text(json.dumps(current, sort_keys=True))
    os.replace(tmp, index_path)
    return str(root)
