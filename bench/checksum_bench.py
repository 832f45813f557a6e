"""What checking the store's sha256 on read costs: sha256 throughput next to read throughput.

    python bench/checksum_bench.py [--mb 256] [--files 4] [--dir DIR]

Writes ``--files`` shard-sized files of random bytes into DIR (default: a temp folder), then prints, in MB/s:
  read cold        reading the files after their pages were dropped from the page cache (the disk)
  read warm        reading them again from the page cache
  sha256 memory    hashlib.sha256 over an in-memory buffer (the CPU bound)
  sha256 file      eagle3.storage.sha256_file on one file at a time (warm)
  sha256 threaded  eagle3.extract.store._hash_files over all files (what HiddenStateStore.check does)
  re-check marked  HiddenStateStore.check of an unchanged store: stat() per shard, no hashing
The check pays the sha256 once per shard and machine (eagle3.extract.store.VerifiedMarks); a stage that reads
the whole store anyway reads it at "read cold" speed, so the first check costs at most its ratio to that.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3 import storage  # noqa: E402
from eagle3.extract.store import VerifiedMarks, _hash_files  # noqa: E402
from eagle3.extract.store_format import shard_name  # noqa: E402


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_all(paths) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass


def _rate(nbytes: int, fn) -> float:
    t0 = time.perf_counter()
    fn()
    return nbytes / 1e6 / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="size of each file in MB")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temp folder)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="checksum-bench-", dir=args.dir))
    size = args.mb << 20
    try:
        paths = []
        for i in range(args.files):
            p = root / shard_name("bench", i)
            with open(p, "wb") as f:
                for _ in range(args.mb):
                    f.write(os.urandom(1 << 20))
            paths.append(p)
        total = size * len(paths)
        for p in paths:
            _drop_cache(p)
        rows = [("read cold", _rate(total, lambda: _read_all(paths))),
                ("read warm", _rate(total, lambda: _read_all(paths)))]
        buf = paths[0].read_bytes()
        rows.append(("sha256 memory", _rate(len(buf), lambda: hashlib.sha256(buf).hexdigest())))
        del buf
        rows.append(("sha256 file", _rate(total, lambda: [storage.sha256_file(p) for p in paths])))
        digests = []
        rows.append(("sha256 threaded", _rate(total, lambda: digests.extend(_hash_files([str(p) for p in paths])))))
        marks = VerifiedMarks(str(root))
        for p, d in zip(paths, digests):
            marks.add(p.name, str(p), d)
        rows.append(("re-check marked", _rate(total, lambda: [marks.holds(p.name, str(p), d)
                                                              for p, d in zip(paths, digests)])))
        print(f"{len(paths)} files x {args.mb} MB in {root} ({os.cpu_count()} CPUs)")
        print(f"{'':18}{'MB/s':>12}{'x cold read':>14}")
        cold = rows[0][1]
        for name, mbs in rows:
            print(f"{name:18}{mbs:12.0f}{mbs / cold:14.2f}")
    finally:
        for p in root.glob("*"):
            p.unlink()
        root.rmdir()


if __name__ == "__main__":
    main()
