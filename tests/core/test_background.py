"""BackgroundWriter: ordered writes off the caller's thread, errors handed back."""

from __future__ import annotations

import threading
import time

import pytest

from eagle3.background import BackgroundWriter


def test_writes_in_order_on_another_thread_and_waits_at_close():
    seen, threads = [], set()

    def write(item):
        time.sleep(0.002)
        seen.append(item)
        threads.add(threading.current_thread().name)

    with BackgroundWriter(write, depth=2, name="w") as bg:
        for i in range(20):
            bg.put(i)
    assert seen == list(range(20)) and threads == {"w"}


def test_a_failed_write_is_raised_to_the_caller_and_later_items_are_skipped():
    seen = []

    def write(item):
        if item == 3:
            raise OSError("disk full")
        seen.append(item)

    bg = BackgroundWriter(write, depth=1)
    with pytest.raises(OSError, match="disk full"):
        for i in range(10):
            bg.put(i)
        bg.close()
    assert seen == [0, 1, 2]
    with pytest.raises(OSError):
        bg.close()  # still reported, the thread is gone


def test_caller_error_stops_the_thread_and_keeps_the_callers_error():
    bg = BackgroundWriter(lambda item: None)
    with pytest.raises(KeyError):
        with bg:
            bg.put(1)
            raise KeyError("caller")
    assert not bg._thread.is_alive()


def test_prefetch_yields_in_order_and_raises_where_the_producer_failed():
    from eagle3.background import prefetch

    assert list(prefetch(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield 1
        yield 2
        raise ValueError("bad row group")

    got = []
    with pytest.raises(ValueError, match="bad row group"):
        for x in prefetch(failing()):
            got.append(x)
    assert got == [1, 2]


def test_prefetch_consumer_stopping_early_releases_the_producer():
    from eagle3.background import prefetch

    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    for x in prefetch(endless(), depth=2):
        if x == 5:
            break
    time.sleep(0.1)
    n = len(produced)
    time.sleep(0.1)
    assert len(produced) == n <= 10  # stopped, a few items ahead at most


def test_hashing_file_checksum_equals_the_files(tmp_path):
    import hashlib

    from eagle3.background import HashingFile

    path = tmp_path / "f.bin"
    with HashingFile(str(path)) as f:
        f.write(b"abc" * 1000)
        f.write(memoryview(bytearray(range(256))))
    assert f.sha256.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()
